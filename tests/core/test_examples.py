"""The examples run as a user runs them and end well."""

from __future__ import annotations

from example_runner import run_example


def test_core_quickstart_runs_and_resumes_bitwise():
  stdout = run_example("quickstart_core.py")
  assert "matched the uninterrupted run bitwise: True" in stdout
  losses = [
    float(line.split("loss")[1].split()[0])
    for line in stdout.splitlines()
    if line.startswith("step")
  ]
  assert losses[-1] < losses[0] / 10, losses


def test_the_worked_transformer_example_trains_logs_and_transplants():
  """examples/transformer_muon_transplant.py: Muon + AdamW from the logical axes with an
  EMA, the hyper-parameters logged each step (the warm-up visible), then AdamW with a
  new parameter through transplant: the Adam branch's moments and the EMA move over,
  the matrices' momentum (no nu beside it) and the new parameter start anew."""
  stdout = run_example("transformer_muon_transplant.py")
  lines = stdout.splitlines()
  steps = [line for line in lines if line.startswith("step")]
  pretrain = [line for line in steps if "adam_learning_rate" in line]
  finetune = [line for line in steps if "adam_learning_rate" not in line]
  assert len(pretrain) == 7 and len(finetune) == 4, stdout

  def value(line, name):
    fields = line.split()
    return float(fields[fields.index(name) + 1])

  # The logged learning rate is the schedule's at each step: warming up, then decaying.
  rates = [value(line, "learning_rate") for line in pretrain]
  assert rates[0] < rates[1] and rates[1] > rates[-1], rates
  assert {value(line, "adam_learning_rate") for line in pretrain} == {0.003}
  assert value(pretrain[-1], "loss") < value(pretrain[0], "loss") / 100
  assert value(finetune[-1], "loss") < value(finetune[0], "loss") / 10

  table = lines[lines.index(next(line for line in lines if line.startswith("transplant:"))) :]
  kept = {line.split()[1] for line in table if line.strip().startswith("kept")}
  initialised = {line.split()[1] for line in table if line.strip().startswith("initialised")}
  # 12 parameters: 6 in Muon's Adam branch (embedding, position, 3 norms, head), 6 matrices.
  # Kept: the step, the branch's mu and nu (12), the EMA of all 12. Initialised: adamw's
  # count and the matrices' mu and nu (13), the new parameter's mu, nu and EMA (3), the
  # EMA's count (it counts the new one's too). Dropped: muon's momentum (6) and its
  # ns_coeffs, the counts of muon, of its Adam branch, of its schedule and of the EMA.
  assert table[0] == "transplant: 25 kept, 17 initialised, 11 dropped", table[0]
  assert "param_states/inner/0/nu/embedding" in kept
  assert "param_states/inner/0/mu/layers/wi" in initialised  # muon's momentum: no nu with it
  assert "param_states/inner/0/mu/task" in initialised
  final = next(line for line in lines if line.startswith("fine-tuned"))
  pretrained = next(line for line in lines if line.startswith("on the new task"))
  assert value(final, "ema") < value(pretrained, "ema") / 10
