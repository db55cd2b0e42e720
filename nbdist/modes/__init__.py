"""One package per training mode: `async_ps` (the hub, also `--mode local` in this kernel),
`sync` (Horovod allreduce) and `simulate` (a virtual cluster on a virtual clock)."""
