"""The user's cell and model, wherever they run: finding the model and data in a cell in the
kernel (`cell.py`), running the cell on an engine, the same way in every mode (`run_cell.py`),
evaluation and the non-finite-step error (`evaluate.py`), feeding the data (`data.py`), the
model's variables as flat float32 buffers (`flat_layout.py`) and its compiled step on them
(`flatmodel.py`), the cell's optimizer as a spec for the hub
(`optimizer_spec.py`), the learning rate the cell set (`learning_rate.py`) and the engine's
GPU (`gpu.py`)."""
