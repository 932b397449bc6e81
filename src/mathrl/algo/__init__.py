"""Pure tensor functions of the RL algorithms: advantages (group baselines, and GAE with a critic),
policy/value/entropy/KL losses, loss aggregation, coefficient controllers and filters. Import them
from their modules (`mathrl.algo.advantages`, `mathrl.algo.losses`, ...); docs/tricks.md maps each
paper trick to its config switch and function here."""
