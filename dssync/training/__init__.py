"""Training: the loop every strategy runs in, the tasks it trains, checkpoints, and Sync-Switch's offline policy search."""
