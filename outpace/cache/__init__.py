"""KV cache memory.

``BlockPool`` hands out fixed-size blocks of the paged KV pool; ``KVCachePool`` owns the
tensors. For hybrid targets (Mamba / linear attention) ``RecurrentStates`` (state_slots.py) holds each
request's recurrent state beside them, with one snapshot per verified position so that after a
verify the state at ``last_correct_step_indices`` is kept (see DESIGN.md).
"""
