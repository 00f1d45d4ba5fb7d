"""Advice in the words of the API a run came from (mpt/speech.py): a script's run is
never told a flag it does not have; the command line's advice is left as it is."""

from mpt import speech

WARNING = ("mixed_float16: this model's ops measured 8.1x float32's time here; worst: "
           "float16 Conv2DBackpropInput runs Eigen, 15.1x float32; measured fastest "
           "here: --policy=mixed_bfloat16 (0.62x float32's time)")


def test_a_scripts_advice_names_no_flag():
  texts = [WARNING,
           "no float32 run of this configuration next to this one: measure it with the "
           "same flags and --policy=float32",
           "--profile_steps=A,B, then --mode=diagnose lists the op types",
           "--batch_size=64 (more work per step) or --jit_compile (fewer, fused ops)",
           "a fixed --loss_scale, or a lower --learning_rate; --cache=memory",
           "python -m mpt.main --flagfile=logs/r/flags.txt --batchnorm=fused"]
  for api in ("mpt.callbacks", "mpt.track"):
    said = [speech.for_api(t, api) for t in texts]
    assert [speech.flags_left(t) for t in said] == [[]] * len(texts), said
  said = speech.for_api(WARNING, "mpt.track")
  assert 'keras.mixed_precision.set_global_policy("mixed_bfloat16")' in said
  assert "with the same script and" in speech.for_api(texts[1], "mpt.callbacks")
  assert "profile_steps=(A, B) in mpt.track(...)" in speech.for_api(texts[2], "mpt.track")


def test_the_command_lines_advice_is_unchanged():
  assert speech.for_api(WARNING, "cli") == WARNING
  assert speech.flags_left(WARNING) == ["--policy="]
  # A whole command anyone can run is not a flag left over; --mode and --run neither.
  assert speech.flags_left("rerun: `python -m mpt --model=a:b --policy=x`; then "
                           "--mode=diagnose --run=logs/r") == []


def test_the_plan_line_names_the_layers_the_map_cannot_hold():
  """docs/usage.md: a plan that moves layers Keras cannot key (no weights, no path)
  lists them in the line it prints, beside the file and how a script applies it."""
  where = "logs/r/policy_map.json"
  line = speech.plan_line(where, ["gap", "mha/softmax"])
  assert line.startswith(f"mpt: the plan as a Keras DTypePolicyMap: {where}; ")
  assert speech.apply_line(where) in line
  assert "not in it: gap, mha/softmax (" in line, line
  assert "set dtype= on them" in line
  # Every layer keyed: nothing said to be missing.
  assert "not in it" not in speech.plan_line(where, [])
