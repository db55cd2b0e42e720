"""The hub (parameter server): shards, epoch schedule, statistics, and its two clients."""
