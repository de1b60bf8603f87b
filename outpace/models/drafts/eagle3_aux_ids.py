"""How a target family reads an EAGLE3 checkpoint's ``eagle_aux_hidden_state_layer_ids``.

outpace captures by *input-of* index (docs: DESIGN.md, "aux hidden states"): capture index i is the
input of target layer i, index L (the number of layers) the last layer's output before the final norm.
Checkpoints write their ids in the convention the draft was trained with, and that depends on the
target family the public serving and training code wrote for it:

- The first-id rule (Llama, DeepSeek-V2/V3, Kimi-K2): a first id of 1 means every id is "output of
  layer X" (capture X + 1); any other first id means the ids already are input-of indices. Absent:
  [2, L // 2, L - 3]. SGLang python/sglang/srt/models/deepseek_v2.py set_eagle3_layers_to_capture
  (the seed review of the fix for lightseekorg/kimi-k2.5-eagle3-mla, whose ids start at 2).
- Gemma 3 / Gemma 4: every id means "output of layer X" (add 1 whatever the first id), so an id of
  L - 1 captures the last layer's output. SGLang gemma3_causal.py / gemma4_causal.py
  set_eagle3_layers_to_capture add 1 unconditionally; the drafts come from SpecForge's Gemma EAGLE3
  training (sgl-project/SpecForge pull 553, specforge/modeling/target/eagle3_target_model.py
  HFEagle3TargetModel: a forward hook on ``layers[id]`` records that layer's *output*), whose
  configs write e.g. [1, 29, 61] for the 62-layer Gemma-3-27B and [5, 17, 29] for the 30-layer
  Gemma-4-26B-A4B (configs/gemma3-27b-eagle3.json, gemma4-26b-a4b-eagle3.json): the first-id rule
  would misread the latter. Absent: [2, L // 2, L - 2], the default of the seed review of SGLang's
  Gemma EAGLE3 change. NOTE: SGLang's stored gemma3_causal.py / gemma4_causal.py default to
  [2, L // 2, L - 3], and SpecForge's default capture ([1, L // 2 - 1, L - 4] output-of,
  specforge/algorithms/model_providers.py resolve_eagle_capture_layers) is [2, L // 2, L - 3]
  input-of too; a draft written without ids by that code expects L - 3.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AuxIdConvention:
    ids_mean_outputs: bool  # every written id is "output of layer X", whatever the first id
    default_last_from_end: int  # absent ids: [2, L // 2, L - default_last_from_end]

    def capture_ids(self, written: tuple[int, ...] | None, num_layers: int) -> tuple[int, ...]:
        """The input-of indices to capture for the ids a checkpoint wrote (None: absent)."""
        if written is None:
            return 2, num_layers // 2, num_layers - self.default_last_from_end
        if self.ids_mean_outputs or written[0] == 1:
            return tuple(i + 1 for i in written)
        return tuple(written)


FIRST_ID_RULE = AuxIdConvention(ids_mean_outputs=False, default_last_from_end=3)
GEMMA_OUTPUT_IDS = AuxIdConvention(ids_mean_outputs=True, default_last_from_end=2)
