"""Advice in the words of the API the run came from.

The detectors write their next steps as mpt's command line would follow them
(`--profile_steps=A,B`, `--batch_size=64`, `--jit_compile`). A script's run
(mpt.callbacks, mpt.track) has none of those flags: `for_api(text, api)` says each in
that API's terms, in this one place, so that no detector needs two versions of its
advice. What has no equivalent in a script (mpt's own model variants, flags of mpt's
data pipeline) is said as what to change in the program. `python -m mpt --mode=...`
commands stay: they run on any run folder.
"""

import re

# (pattern, replacement) in order; `{api}` is the run's entry point.
_RULES = (
    (r"python -m mpt(?:\.main)? --flagfile=\S+ --batchnorm=fused(?: [^;,.]*)?",
     "mpt.models.fused_bn.FusedBatchNormalization in place of your BatchNormalization "
     "layers"),
    (r"--profile_steps=A,B", "profile_steps=(A, B) in {api}(...)"),
    (r"with the same flags and ", "with the same script and "),
    (r"--batch_size=(\d+)", r"a batch size of \1"),
    (r"--batch_size", "the batch size"),
    (r"--jit_compile", "XLA (model.compile(..., jit_compile=True), or "
                       "tf.function(jit_compile=True) around your own step)"),
    (r"--policy=auto", "each policy in turn"),
    (r"--policy=(\w+)", r'keras.mixed_precision.set_global_policy("\1")'),
    (r"--policy", "the policy (keras.mixed_precision.set_global_policy)"),
    (r"--learning_rate", "learning rate"),
    (r"--loss_scale", "loss scale (LossScaleOptimizer(..., dynamic=False, "
                      "initial_scale=...))"),
    (r"--cache=memory", "dataset.cache() after decoding"),
    (r"--batchnorm=fused", "mpt.models.fused_bn.FusedBatchNormalization"),
    (r"--model=\S+_aligned where registered", "input channels padded to 8"),
    (r"--model=\S+ \(pads the input channels to 8\)", "input channels padded to 8"),
    (r"--notf32", "tf.config.experimental.enable_tensor_float_32_execution(False)"),
    (r"--onednn=(\w+)", r"TF_ENABLE_ONEDNN_OPTS=\1 set before TensorFlow starts"),
)
# A per-layer plan as a script applies it: the DTypePolicyMap a run folder holds
# (written by mpt/measure/policies.py).
MAP_FILE = "policy_map.json"
# Flags any run folder can be given (other modes of `python -m mpt`).
KEPT = re.compile(r"--(mode|run)=")


def for_api(text: str | None, api: str) -> str | None:
  """`text` as a run of `api` can follow it ("cli": unchanged)."""
  if not text or api == "cli":
    return text
  for pattern, replacement in _RULES:
    text = re.sub(pattern, replacement.replace("{api}", api), text)
  return text


def flags_left(text: str) -> list[str]:
  """The command-line flags `text` still names outside a whole `python -m mpt ...`
  command (which anyone can run), other than --mode= and --run=."""
  text = re.sub(r"python -m mpt(\.main)?[^`;)\n]*", "", text)
  return [m.group(0) for m in re.finditer(r"--[a-z][a-z0-9_]*=?", text)
          if not KEPT.match(text, m.start())]


def apply_line(where) -> str:
  """What a script does, before it builds its model, to apply the policy map at
  `where` (a policy_map.json)."""
  return ("keras.mixed_precision.set_global_policy(keras.saving."
          f"deserialize_keras_object(json.load(open('{where}'))['policy_map'])) "
          "before the model is built")


def plan_line(where, unkeyed: list[str]) -> str:
  """The line that says a plan was written as a policy map, how a script applies it,
  and the layers the map cannot hold."""
  line = f"mpt: the plan as a Keras DTypePolicyMap: {where}; a script applies it with " \
      + apply_line(where)
  if unkeyed:
    line += (f"; not in it: {', '.join(unkeyed[:6])} (Keras keys a map by a layer's "
             "path, which only layers with weights have: set dtype= on them)")
  return line
