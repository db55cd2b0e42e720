"""The user's cell and model, wherever they run: finding the model and data in a cell (`cell.py`),
feeding the data (`data.py`), the model as one flat float32 buffer (`flatmodel.py`), the
learning rate the cell set (`learning_rate.py`) and the engine's GPU (`gpu.py`)."""
