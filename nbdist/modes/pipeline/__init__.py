"""`--mode pipeline`: the cell's model cut into S stages, one per engine, with M micro-batches
in flight per mini-batch (GPipe or 1F1B), cut points chosen from measured layer costs.

`start.py` profiles the model on the first stage's engine (`profile`), cuts it
(`nbdist.core.partition`, `graph`), starts one stage per engine (`stage`, talking over
`link`) and returns a `PipelineRun` (`run`) whose `profile`, `partition` and `pipeline`
show what was measured, chosen and seen.
"""
