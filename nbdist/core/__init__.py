"""The pure core: what a parameter shard decides, on NumPy arrays and the standard library only.

One parameter shard (`shard.ShardCore`, driven by the hub's socket loop and by the simulator),
the epoch schedule, DBS batch sizes, the coordinator (chunks, SSP clock, groups, control), the
update path (rule then optimizer), group barriers, statistics, the timeline, wire compression
and the simulator's cost model. No sockets, threads, TensorFlow or ipyparallel here, so every
function is tested with exact, hand-computed values (a test enforces the imports).
"""
