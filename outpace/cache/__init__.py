"""KV cache memory.

``BlockPool`` hands out fixed-size blocks of the paged KV pool; ``KVCachePool`` owns the
tensors. Hybrid targets (Mamba / linear attention) will add a per-request recurrent-state slot
pool beside them, with one snapshot per verified position so that after a verify the state at
``last_correct_step_indices`` is kept (see DESIGN.md).
"""
