"""optcore.with_statistics / optcore.statistics: each group's gradient, update and parameter
norms equal the norms computed by hand (NumPy, float64) from the same gradients and the
parameters before and after the step; groups by path depth and by regex; a skipped step's
statistics; the names and the errors (issue 40)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optcore


def params():
  rng = np.random.default_rng(0)
  layer = lambda: {
    "attention": {"kernel": jnp.asarray(rng.normal(size=(4, 4)), jnp.float32)},
    "mlp": {"kernel": jnp.asarray(rng.normal(size=(4, 8)), jnp.float32)},
  }
  return {"layers": [layer(), layer()], "head": {"bias": jnp.asarray(rng.normal(size=3))}}


def grads(i, tree):
  key = jax.random.key(i)
  leaves, treedef = jax.tree.flatten(tree)
  return treedef.unflatten(
    [jax.random.normal(jax.random.fold_in(key, j), x.shape) for j, x in enumerate(leaves)]
  )


def by_hand(before, after, g, group_of):
  """{group/field: float} from the leaves' paths, in float64."""
  sums: dict[str, np.ndarray] = {}
  named, _ = optcore.leaves_with_paths(before)
  for (path, old), new, grad in zip(named, jax.tree.leaves(after), jax.tree.leaves(g), strict=True):
    old, new, grad = (np.asarray(x, np.float64) for x in (old, new, grad))
    row = np.array([np.sum(grad**2), np.sum((new - old) ** 2), np.sum(new**2)])
    for group in {group_of(path), "global"} - {None}:
      sums[group] = sums.get(group, 0) + row
  out = {}
  for group, row in sums.items():
    norms = np.sqrt(row)
    out |= {f"{group}/grad_norm": norms[0], f"{group}/update_norm": norms[1]}
    out |= {f"{group}/param_norm": norms[2], f"{group}/update_ratio": norms[1] / norms[2]}
  return out


STEP = jax.jit(lambda opt, g: opt.apply_gradient(g))


@pytest.mark.parametrize(
  ("groups", "group_of"),
  [
    (1, lambda path: path.split("/")[1]),
    (2, lambda path: "/".join(path.split("/")[1:3])),
    ({"attention": "/attention/", "mlp": "/mlp/"}, lambda path: path.split("/")[3]
     if path.startswith("/layers") else None),
  ],
  ids=["depth 1", "depth 2", "regex"],
)  # fmt: skip
def test_the_statistics_are_the_norms_computed_by_hand(groups, group_of):
  opt = optcore.with_statistics(optcore.adamw(0.1, weight_decay=0.1), groups).create(params())
  for i in range(3):
    before, g = opt.target, grads(i, opt.target)
    opt = STEP(opt, g)
  got = optcore.statistics(opt)
  want = by_hand(before, opt.target, g, group_of)
  assert set(got) == set(want)
  for name, value in want.items():
    np.testing.assert_allclose(float(got[name]), value, rtol=2e-6, err_msg=name)


def test_names_are_stable_and_the_statistics_come_out_of_jit():
  opt = optcore.with_statistics(optcore.sgd(0.1)).create(params())
  step = jax.jit(lambda opt, g: (lambda o: (o, optcore.statistics(o)))(opt.apply_gradient(g)))
  opt, stats = step(opt, grads(0, opt.target))
  fields = ("grad_norm", "update_norm", "param_norm", "update_ratio")
  assert sorted(stats) == sorted(f"{g}/{f}" for g in ("layers", "head", "global") for f in fields)
  assert {x.shape for x in stats.values()} == {()}
  assert {x.dtype for x in stats.values()} == {jnp.dtype(jnp.float32)}


def test_a_skipped_step_shows_its_gradient_and_no_update():
  opt_def = optcore.with_statistics(optcore.skip_bad_steps(optcore.sgd(0.1), warmup=2))
  opt = opt_def.create(params())
  for i in range(3):
    opt = STEP(opt, grads(i, opt.target))
  spike = jax.tree.map(lambda x: 1000 * x, grads(3, opt.target))
  opt = STEP(opt, spike)
  stats = optcore.statistics(opt)
  assert int(optcore.skipped_steps(opt)) == 1
  assert float(stats["global/update_norm"]) == 0.0
  squares = sum(np.sum(np.asarray(x, np.float64) ** 2) for x in jax.tree.leaves(spike))
  np.testing.assert_allclose(float(stats["global/grad_norm"]), np.sqrt(squares), rtol=2e-6)


@pytest.mark.parametrize(
  ("groups", "error", "match"),
  [
    (0, TypeError, "a path depth"),
    ({"global": "x"}, TypeError, "other than 'global'"),
    ({"a": "("}, ValueError, "is no regex"),
  ],
)
def test_wrong_groups_are_refused_by_name(groups, error, match):
  with pytest.raises(error, match=match):
    optcore.with_statistics(optcore.sgd(0.1), groups)


def test_statistics_of_a_definition_without_them_says_how_to_keep_them():
  with pytest.raises(TypeError, match=r"keeps no statistics; wrap it: optcore\.with_statistics"):
    optcore.statistics(optcore.sgd(0.1).create(params()))


def test_the_read_outs_take_the_state_of_as_optax_with_its_definition():
  opt_def = optcore.with_statistics(optcore.skip_bad_steps(optcore.adam(0.1), warmup=2))
  tx = opt_def.as_optax()
  p = {"w": jnp.ones(4)}
  state = tx.init(p)
  _, state = tx.update({"w": 2 * jnp.ones(4)}, state, p)
  _, state = tx.update({"w": jnp.full(4, jnp.nan)}, state, p)
  stats = optcore.statistics(state, optimizer_def=opt_def)
  assert np.isnan(float(stats["w/grad_norm"])) and float(stats["w/update_norm"]) == 0.0
  assert int(optcore.skipped_steps(state, optimizer_def=opt_def)) == 1
  with pytest.raises(TypeError, match=r"optcore\.statistics\(opt_state, optimizer_def=opt_def\)"):
    optcore.statistics(state)


def test_a_depth_past_the_deepest_path_gives_one_group_per_parameter():
  opt = optcore.with_statistics(optcore.sgd(0.1), groups=9).create(params())
  stats = optcore.statistics(STEP(opt, grads(0, opt.target)))
  names = {k.rsplit("/", 1)[0] for k in stats} - {"global"}
  assert names == {p.lstrip("/") for p, _ in optcore.leaves_with_paths(params())[0]}


def test_statistics_in_two_groups_are_each_under_their_group():
  """with_statistics inside two MultiOptimizer groups: the global/* keys of one overwrote the
  other's; each group's lines are under its index, as current_hyper_params names groups."""
  multi = optcore.MultiOptimizer(
    ("w", optcore.with_statistics(optcore.sgd(0.1))),
    ("b", optcore.with_statistics(optcore.adam(0.1))),
  )
  params = {"w": jnp.ones(4), "b": jnp.ones(2)}
  opt = multi.create(params).apply_gradient({"w": jnp.ones(4), "b": jnp.ones(2)})
  stats = optcore.statistics(opt)
  assert float(stats["0/global/grad_norm"]) == 2.0  # four ones
  assert float(stats["1/global/grad_norm"]) == pytest.approx(2.0**0.5)  # two ones
  assert "global/grad_norm" not in stats


def many_leaves():
  """Two groups of small leaves (more than one reduction's worth each: 11 and 5), 1-D and
  2-D, float32 and bfloat16, beside a leaf of 2^16 elements, which has its own reductions."""
  rng = np.random.default_rng(1)
  small = lambda i: rng.normal(size=(3 + i, 5) if i % 2 else (7 + i,))
  return {
    "blocks": [jnp.asarray(small(i), jnp.float32) for i in range(11)],
    "norms": [jnp.asarray(small(i), jnp.bfloat16 if i == 2 else jnp.float32) for i in range(5)],
    "wide": {"kernel": jnp.asarray(rng.normal(size=(256, 256)), jnp.float32)},
  }


def test_small_leaves_summed_together_give_the_norms_computed_by_hand(monkeypatch):
  """On one device small leaves of about one size are summed a few at a time, padded and
  stacked (issue 52): the norms computed by hand, and, within float32's reordering, those of
  one reduction a leaf (the form every mesh keeps)."""
  from optcore._src.wrappers import statistics as module

  assert module._one_device(), "the core's tests run on one device"
  opt_def = optcore.with_statistics(optcore.adamw(0.1, weight_decay=0.1))
  runs = {}
  for together in (True, False):
    monkeypatch.setattr(module, "_one_device", lambda together=together: together)
    step = jax.jit(lambda opt, g: opt.apply_gradient(g))  # its own trace
    opt = opt_def.create(many_leaves())
    for i in range(2):
      before, g = opt.target, grads(i, opt.target)
      opt = step(opt, g)
    runs[together] = optcore.statistics(opt)
    want = by_hand(before, opt.target, g, lambda path: path.split("/")[1])
    assert set(runs[together]) == set(want)
    for name, value in want.items():
      # float32 sums against float64: 8.7e-8 at most (default, SSE4_2 and AVX instructions)
      np.testing.assert_allclose(float(runs[together][name]), value, rtol=1e-6, err_msg=name)
  for name, value in runs[True].items():
    # the two orders of summation: 9.8e-8 at most (default, SSE4_2 and AVX instructions)
    np.testing.assert_allclose(float(value), float(runs[False][name]), rtol=1e-6, err_msg=name)


def test_the_norms_are_one_array_in_the_state_and_an_array_a_group_in_state_dicts():
  """Issue 52: the groups' rows are one (groups, 3) array (an output array a group was a kernel
  a group), the names static beside it; a state dict keeps the layout it had, an array a group
  (a checkpoint written before restores), and reads back into the names of the tree it is
  restored into; a group that matches nothing is a row of zeros."""
  groups = {"mlp": "/mlp/", "nothing": "/absent/", "attention": "/attention/"}
  with pytest.warns(UserWarning, match=r"group 'nothing'"):
    opt = optcore.with_statistics(optcore.sgd(0.1), groups).create(params())
  opt = STEP(opt, grads(0, opt.target))
  kept = opt.state.param_states.values
  assert isinstance(kept, optcore.GroupNorms)
  assert kept.names == ("mlp", "nothing", "attention", "global")  # the user's order
  assert kept.norms.shape == (4, 3) and kept.norms.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(kept.norms[1]), np.zeros(3))
  stats = optcore.statistics(opt)
  for i, name in enumerate(kept.names):
    assert float(stats[f"{name}/update_norm"]) == float(kept.norms[i, 1])
  written = opt.state_dict()["state"]["param_states"]["values"]
  assert sorted(written) == sorted(kept.names)
  assert {(v.shape, v.dtype) for v in written.values()} == {((3,), np.dtype(np.float32))}
  # as a checkpoint gives it back: NumPy, rows in another order
  saved = jax.tree.map(np.asarray, opt.state_dict())
  saved["state"]["param_states"]["values"] = dict(reversed(written.items()))
  with pytest.warns(UserWarning, match=r"group 'nothing'"):
    fresh = optcore.with_statistics(optcore.sgd(0.1), groups).create(params())
  restored = fresh.restore_state(saved).state.param_states.values
  assert restored.names == kept.names and isinstance(restored.norms, jax.Array)
  np.testing.assert_array_equal(restored.norms, kept.norms)
  # a row missing or of another shape is refused at its path, nothing restored
  del saved["state"]["param_states"]["values"]["mlp"]
  with pytest.raises(optcore.StateDictError, match=r"param_states/values/mlp.*missing"):
    fresh.restore_state(saved)
  saved["state"]["param_states"]["values"]["mlp"] = np.ones(4, np.float32)
  with pytest.raises(optcore.StateDictError, match=r"param_states/values/mlp.*shape \(3,\)"):
    fresh.restore_state(saved)


def mixed_sizes():
  """Leaves of each kind the sums take: small ones shared four at a time, matrices summed
  along rows of 128 (64k values and more), and one summed after the step on a CPU (2**18)."""
  rng = np.random.default_rng(3)
  normal = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
  return {
    "small": [normal(n) for n in (1, 7, 30, 33, 900)],
    "matrix": {"kernel": normal(300, 256), "odd": normal(257, 257)},
    "huge": {"kernel": normal(512, 512)},
  }


@pytest.mark.parametrize(
  "opt_def",
  [optcore.adamw(0.1, weight_decay=0.1), optcore.adafactor(0.1), optcore.lion(0.01)],
  ids=["adamw (element-wise)", "adafactor (not)", "lion (element-wise)"],
)
def test_every_kind_of_leaf_gives_the_norms_computed_by_hand(opt_def):
  """Summed ahead of the step's writes (an element-wise definition's leaves below 2**18 on a
  CPU) or after them (the rest): the norms by hand, and the parameters bitwise those of the
  step without statistics (issue 65)."""
  params = mixed_sizes()
  step = jax.jit(lambda opt, g: opt.apply_gradient(g), donate_argnums=(0,))
  own = lambda: jax.tree.map(jnp.copy, params)  # each optimizer its own: the step donates
  watched, plain = optcore.with_statistics(opt_def).create(own()), opt_def.create(own())
  for i in range(2):
    before, g = jax.tree.map(np.asarray, watched.target), grads(i, watched.target)
    watched, plain = step(watched, g), step(plain, g)
  for new, same in zip(jax.tree.leaves(watched.target), jax.tree.leaves(plain.target), strict=True):
    np.testing.assert_array_equal(np.asarray(new), np.asarray(same))
  got = optcore.statistics(watched)
  want = by_hand(before, watched.target, g, lambda path: path.split("/")[1])
  assert set(got) == set(want)
  for name, value in want.items():
    # float32 sums against float64: 4.0e-7 at most (default, SSE4_2 and AVX instructions; jax
    # 0.10.2 and 0.12)
    np.testing.assert_allclose(float(got[name]), value, rtol=1e-6, err_msg=name)


def transformer_shaped():
  """10 matrices of 256 columns (76.8k values each) and 60 small leaves of 1 to 1,200."""
  rng = np.random.default_rng(4)
  params = {f"m{i}": jnp.asarray(rng.normal(size=(300, 256)), jnp.float32) for i in range(10)}
  for i, n in enumerate(np.round(np.geomspace(1, 1200, 60)).astype(int)):
    params[f"s{i:02d}"] = jnp.asarray(rng.normal(size=int(n)), jnp.float32)
  return params


def compiled_step(opt_def, params):
  grads = jax.tree.map(jnp.ones_like, params)
  step = jax.jit(lambda opt, g: opt.apply_gradient(g), donate_argnums=(0,))
  compiled = step.lower(opt_def.create(params), grads).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  count = sum(p.size for p in params.values())
  lines = compiled.as_text().splitlines()
  copied = [line for line in lines if " copy(" in line and "f32[300,256]" in line]
  return cost["bytes accessed"] / count, copied


def test_an_element_wise_step_reads_its_sums_ahead_and_copies_no_parameter():
  """Issue 65: the sums of an element-wise step are read in one pass over its gradients,
  parameters and state before it writes, so a donated step keeps no copy of the old
  parameters. XLA's bytes accessed a parameter: adamw 40.0, with statistics 56.4 on this
  model with jax 0.10.2 and 0.12 (16 for the pass, 0.4 for the rows' sums and the small
  leaves' padding); without the pass (new minus old after the write) it was 71.4."""
  params = transformer_shaped()
  plain, _ = compiled_step(optcore.adamw(1e-3), params)
  watched, copied = compiled_step(optcore.with_statistics(optcore.adamw(1e-3)), params)
  assert not copied, copied
  assert watched - plain <= 17.0, (plain, watched)
