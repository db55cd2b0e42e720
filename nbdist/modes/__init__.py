"""One package per training mode: `async_ps` (the hub, also `--mode local` in this kernel),
`sync` (Horovod allreduce), `simulate` (a virtual cluster on a virtual clock) and `pipeline`
(the model cut into stages across engines)."""
