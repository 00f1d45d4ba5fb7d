"""A KerasHub decoder-only language model trained from scratch: a Gemma backbone built
from its config (two blocks, grouped-query attention with one key/value head,
rotary embeddings, RMS norms, a gated feed-forward), random weights, no tokenizer
and no download; GemmaCausalLM over token ids with a padding mask, next-token
targets and sample weights; mixed_bfloat16 with AdamW.

Follows in shape the "pretraining a backbone" part of KerasHub's Getting Started
guide (a backbone built from its arguments, a task fed token ids), at toy sizes.
"""

import keras
import keras_hub
import numpy as np

import mpt

BATCH, STEPS_PER_EPOCH, EPOCHS, LENGTH, VOCABULARY = 4, 4, 2, 16, 97


def main(run_dir: str) -> dict:
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(5)
  n = BATCH * STEPS_PER_EPOCH
  ids = rng.integers(1, VOCABULARY, size=(n, LENGTH + 1)).astype("int32")
  lengths = rng.integers(LENGTH // 2, LENGTH + 1, size=n)
  mask = np.arange(LENGTH)[None, :] < lengths[:, None]
  x = {"token_ids": np.where(mask, ids[:, :-1], 0), "padding_mask": mask}
  backbone = keras_hub.models.GemmaBackbone(
      vocabulary_size=VOCABULARY, num_layers=2, num_query_heads=2,
      num_key_value_heads=1, hidden_dim=32, intermediate_dim=64, head_dim=16)
  model = keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)
  model.compile(optimizer=keras.optimizers.AdamW(1e-3),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                weighted_metrics=["accuracy"])
  model.fit(x, ids[:, 1:], sample_weight=mask.astype("float32"), batch_size=BATCH,
            epochs=EPOCHS, verbose=0,
            callbacks=mpt.callbacks(run_dir, batch_size=BATCH, warmup_steps=2,
                                    log_every=5, sample_every=None))
  return {"status": "completed", "steps": STEPS_PER_EPOCH * EPOCHS,
          "epochs_completed": EPOCHS, "policy": "mixed_bfloat16", "loop": "fit",
          "skipped_steps": 0, "loss_scale": None}
