"""The memory plan behind `mathrl plan`: what each GPU holds for a recipe (weights, gradients, optimizer
states, activations, the reference and critic, the rollout engines and generators, kept versions),
the phase peaks, the verdict and the setup time. Pure arithmetic over the config and the model's
architecture: no torch at import, nothing loaded. `memory.py` is the entry (`estimate_memory`)."""
