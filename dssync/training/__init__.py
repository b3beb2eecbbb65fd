"""Training: the loop every strategy runs in, the tasks it trains, checkpoints, Sync-Switch's offline policy search, and DS-Sync as a torch model averager."""
