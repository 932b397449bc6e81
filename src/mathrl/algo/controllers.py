"""Coefficient controllers for the KL penalty and the entropy bonus, one small interface for all::

    coef = controller.update(measured, n_steps=batch_size)   # once per RL step: the next coefficient
    loss = pg_loss - coef * entropy_term
    ckpt["entropy_ctl"] = controller.state_dict()             # checkpointable

``state_dict()`` holds only the mutable state (the coefficient and, for Skywork, the active flag);
hyper-parameters come from the config, so a run resumed with the same config continues exactly.
Entropy sign: a positive coefficient is a *bonus* (``loss - coef * entropy``); raising it pushes entropy up.

``algo.entropy.mode``: ``none`` (no term), ``fixed`` (``FixedCoef(algo.entropy.coef)``),
``adaptive`` (``AdaptiveEntropyController``), ``skywork`` (``SkyworkEntropyController``).

Run the tests with ``python -m pytest tests/algo/test_controllers.py -q``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from torch import Tensor

__all__ = [
    "CoefController",
    "FixedCoef",
    "AdaptiveKLController",
    "AdaptiveEntropyController",
    "SkyworkEntropyController",
]


class CoefController(Protocol):
    """What the training loop relies on."""

    @property
    def coef(self) -> float: ...

    def update(self, measured: float | Tensor | None = None, *, n_steps: int = 1) -> float: ...

    def state_dict(self) -> dict[str, float | bool]: ...

    def load_state_dict(self, state: Mapping[str, float | bool]) -> None: ...


def _require(state: Mapping[str, float | bool], keys: tuple[str, ...], owner: str) -> None:
    missing = [k for k in keys if k not in state]
    if missing:
        raise KeyError(f"{owner}.load_state_dict: missing keys {missing}; got {sorted(state)}")


def _check_bounds(init_coef: float, min_coef: float, max_coef: float, owner: str) -> None:
    if min_coef > max_coef:
        raise ValueError(f"{owner}: min_coef ({min_coef}) must be <= max_coef ({max_coef})")
    if not min_coef <= init_coef <= max_coef:
        raise ValueError(
            f"{owner}: init_coef ({init_coef}) must lie in [min_coef, max_coef] = "
            f"[{min_coef}, {max_coef}]"
        )


def _clamp(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


class FixedCoef:
    """A constant coefficient (``algo.entropy.mode: fixed`` with ``algo.entropy.coef``, or a fixed
    ``algo.kl.coef``). ``update`` ignores its arguments."""

    def __init__(self, value: float) -> None:
        self._value = float(value)

    @property
    def coef(self) -> float:
        return self._value

    def update(self, measured: float | Tensor | None = None, *, n_steps: int = 1) -> float:
        return self._value

    def state_dict(self) -> dict[str, float | bool]:
        return {"coef": self._value}

    def load_state_dict(self, state: Mapping[str, float | bool]) -> None:
        _require(state, ("coef",), type(self).__name__)
        self._value = float(state["coef"])


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, "Fine-Tuning Language Models from Human
    Preferences", §2: beta varied by a proportional controller; as in their lm-human-preferences
    code and trl's ``AdaptiveKLController``).

        e    = clip(KL / target_kl - 1, -0.2, 0.2)          proportional error, clipped
        coef = coef * (1 + e * n_steps / horizon)

    ``n_steps`` is the number of samples (responses) since the last update, so ``horizon`` is in
    samples: the coefficient changes by at most 20% per ``horizon`` samples.
    """

    def __init__(self, init_coef: float, target_kl: float, horizon: float) -> None:
        if target_kl <= 0:
            raise ValueError(f"AdaptiveKLController: target_kl must be > 0, got {target_kl}")
        if horizon <= 0:
            raise ValueError(f"AdaptiveKLController: horizon must be > 0, got {horizon}")
        if init_coef < 0:
            raise ValueError(f"AdaptiveKLController: init_coef must be >= 0, got {init_coef}")
        self.target_kl = float(target_kl)
        self.horizon = float(horizon)
        self._coef = float(init_coef)

    @property
    def coef(self) -> float:
        return self._coef

    def update(self, measured: float | Tensor | None = None, *, n_steps: int = 1) -> float:
        """``measured``: the mean per-token (or per-sequence, matching ``target_kl``) KL."""
        if measured is None:
            raise ValueError("AdaptiveKLController.update needs the measured KL")
        error = _clamp(float(measured) / self.target_kl - 1.0, -0.2, 0.2)
        self._coef *= 1.0 + error * n_steps / self.horizon
        return self._coef

    def state_dict(self) -> dict[str, float | bool]:
        return {"coef": self._coef}

    def load_state_dict(self, state: Mapping[str, float | bool]) -> None:
        _require(state, ("coef",), type(self).__name__)
        self._coef = float(state["coef"])


class _EntropyController:
    """What the two entropy controllers share: a start coefficient kept within [min_coef, max_coef],
    a target entropy, and one move per update from the measured entropy (`_move`, their one
    difference). ``coef`` is the coefficient of the coming loss."""

    _extra_state: tuple[str, ...] = ()  # keys besides "coef" that a subclass's state holds

    def __init__(self, init_coef: float, target_entropy: float, *, size: float, size_name: str,
                 min_coef: float, max_coef: float) -> None:
        owner = type(self).__name__
        if size < 0:
            raise ValueError(f"{owner}: {size_name} must be >= 0, got {size}")
        _check_bounds(init_coef, min_coef, max_coef, owner)
        self.target_entropy = float(target_entropy)
        self.min_coef = float(min_coef)
        self.max_coef = float(max_coef)
        self._raw_coef = float(init_coef)

    @property
    def coef(self) -> float:
        return self._raw_coef

    def _move(self, entropy: float) -> float:
        """The coefficient's change for a batch of mean entropy `entropy` (before the clamp)."""
        raise NotImplementedError

    def update(self, measured: float | Tensor | None = None, *, n_steps: int = 1) -> float:
        """``measured``: the batch's mean token entropy. ``n_steps`` is ignored."""
        if measured is None:
            raise ValueError(f"{type(self).__name__}.update needs the measured entropy")
        entropy = float(measured)
        self._raw_coef = _clamp(self._raw_coef + self._move(entropy), self.min_coef, self.max_coef)
        self._after(entropy)
        return self.coef

    def _after(self, entropy: float) -> None:
        """A subclass's state change after the coefficient moved (none here)."""

    def state_dict(self) -> dict[str, float | bool]:
        return {"coef": self._raw_coef}

    def load_state_dict(self, state: Mapping[str, float | bool]) -> None:
        _require(state, ("coef", *self._extra_state), type(self).__name__)
        self._raw_coef = float(state["coef"])


class AdaptiveEntropyController(_EntropyController):
    """Proportional entropy-coefficient controller (``algo.entropy.mode: adaptive``).

        coef = clamp(coef + kp * (target_entropy - entropy), min_coef, max_coef)

    Entropy below target raises the bonus, above target lowers it. This is the automatic
    temperature adjustment of Soft Actor-Critic (Haarnoja et al. 2018, "Soft Actor-Critic
    Algorithms and Applications", §5) done as a plain step of size ``kp`` on the measured
    entropy, with bounds. Switches ``algo.entropy.target``, ``algo.entropy.kp``,
    ``algo.entropy.min_coef``, ``algo.entropy.max_coef``; ``algo.entropy.coef`` is the start.
    """

    def __init__(self, init_coef: float, target_entropy: float, *, kp: float, min_coef: float,
                 max_coef: float) -> None:
        super().__init__(init_coef, target_entropy, size=kp, size_name="kp", min_coef=min_coef, max_coef=max_coef)
        self.kp = float(kp)

    def _move(self, entropy: float) -> float:
        return self.kp * (self.target_entropy - entropy)


class SkyworkEntropyController(_EntropyController):
    """Skywork-OR1 adaptive entropy control (He et al. 2025, "Skywork Open Reasoner 1 Technical
    Report", MAGIC loss, "Adaptive Entropy Control"; ``algo.entropy.mode: skywork``).

        c    <- clamp(c + step, min_coef, max_coef)   if entropy < target
        c    <- clamp(c - step, min_coef, max_coef)   if entropy > target
        coef  = c if entropy <= target else 0         (``active`` says which)

    The entropy loss is switched on only while entropy is at or below the target, so the bonus
    can rescue a collapsing policy but never pushes entropy above the target. The coefficient
    returned by ``update`` (and ``coef``) is the one to use in the coming loss; the internal
    ``raw_coef`` c keeps accumulating. Before the first update ``active`` is True.
    Switches ``algo.entropy.target``, ``algo.entropy.step``, ``algo.entropy.min_coef``,
    ``algo.entropy.max_coef``; ``algo.entropy.coef`` is c_0 (0 in the paper).
    """

    _extra_state = ("active",)

    def __init__(self, init_coef: float, target_entropy: float, *, step: float, min_coef: float,
                 max_coef: float) -> None:
        super().__init__(init_coef, target_entropy, size=step, size_name="step", min_coef=min_coef, max_coef=max_coef)
        self.step = float(step)
        self._active = True

    @property
    def raw_coef(self) -> float:
        """The accumulated coefficient c, whether or not the loss is active."""
        return self._raw_coef

    @property
    def active(self) -> bool:
        """Whether the entropy loss applies (entropy <= target at the last update)."""
        return self._active

    @property
    def coef(self) -> float:
        return self._raw_coef if self._active else 0.0

    def _move(self, entropy: float) -> float:
        if entropy == self.target_entropy:
            return 0.0
        return self.step if entropy < self.target_entropy else -self.step

    def _after(self, entropy: float) -> None:
        self._active = entropy <= self.target_entropy

    def state_dict(self) -> dict[str, float | bool]:
        return {"coef": self._raw_coef, "active": self._active}

    def load_state_dict(self, state: Mapping[str, float | bool]) -> None:
        super().load_state_dict(state)
        self._active = bool(state["active"])
