"""grpo: Group Relative Policy Optimization for language models."""

import os
import sys

# PyTorch's CPU allocator puts tensors of 2 MB and more on transparent huge pages when this is set
# before its first allocation (it reads it once). A training step allocates and frees hundreds of MB
# of activations and gradients; on 4 KB pages each fresh buffer is faulted in page by page (~1 us a
# page on the 2-core VM we measure on: ~330k faults per 4 x 8 update, issue 4). Set only where torch
# is not imported yet and the user has not chosen; THP_MEM_ALLOC_ENABLE=0 turns it off.
if "torch" not in sys.modules:
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

__version__ = "0.1.0"
