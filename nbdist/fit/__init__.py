"""A cell's own `model.fit(...)` call, distributed: the call is the run's specification.

- `plan.py`: the call's arguments and the magic's flags merged into the run's options (a flag
  wins, and the run's notes say so), and what the run keeps of the call (`FitSpec`);
- `launch.py`: what happens when the cell reaches its call in the kernel: the data it names is
  put in place, the job prepared, the run started and driven, and Keras's `History` returned,
  so the statements after the call run on the trained model;
- `driver.py`: the epochs as Keras's `fit` shows them to callbacks: each epoch's logs (the
  training metrics the workers summed, validation evaluated here on the epoch's weights),
  `on_epoch_end` with `self.model` holding those weights, learning-rate and stop decisions
  passed on to the run.
The engines' side (stopping the cell at its call, placing the data) is in `nbdist.engine`.
"""
