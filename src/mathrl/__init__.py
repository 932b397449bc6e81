"""mathrl: reinforcement learning from verifiable rewards for math reasoning."""

__version__ = "0.1.0"
