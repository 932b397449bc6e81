"""Generator processes (rollout.max_staleness k >= 1): `host.py` runs in the trainer (spawn, send versioned
weights, take the next batch from the bounded queue), `worker.py` in each generator process (its own
engine, sampling ahead with weights at most k versions old). The step sees them only through
`Trainer.sync_weights` and the batch it is handed."""
