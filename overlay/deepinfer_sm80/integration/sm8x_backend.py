"""The SM8x attention backend's name: the layer registers it (attention.py, `get_name`), its selection
factory names it in errors and startup notes (attention_select.py). Here, below both, so the layer need not
import the factory that imports it; no vLLM import.
"""

BACKEND_NAME = "DEEPINFER_SM8X_SPARSE_DSV41"
