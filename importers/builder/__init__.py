"""`autoclust.Builder`: graphs written op by op (`builder.py`; op methods in `ops.py`,
Loop/If bodies as Python callables in `control.py`)."""
