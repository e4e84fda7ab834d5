"""Selecting parameters by path: traversals, predicates, regexes and masks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tree_testing import Linear

import optcore


def params():
  return {
    "Dense_0": {"kernel": jnp.ones((2, 3)), "bias": jnp.zeros(3)},
    "Dense_1": {"kernel": 2 * jnp.ones((3, 1)), "bias": jnp.zeros(1)},
    "blocks": [{"scale": jnp.ones(4)}, (jnp.ones(5), jnp.ones(6))],
  }


def test_traversal_paths_are_flax_style_with_a_leading_slash():
  seen = []
  optcore.ModelParamTraversal(lambda path, value: seen.append(path) or False).mask(params())
  assert seen == [
    "/Dense_0/bias",
    "/Dense_0/kernel",
    "/Dense_1/bias",
    "/Dense_1/kernel",
    "/blocks/0/scale",
    "/blocks/1/0",
    "/blocks/1/1",
  ]


def test_iterate_update_and_set():
  kernels = optcore.ModelParamTraversal(lambda path, _: "kernel" in path)
  assert [x.shape for x in kernels.iterate(params())] == [(2, 3), (3, 1)]
  doubled = kernels.update(lambda x: 2 * x, params())
  np.testing.assert_array_equal(doubled["Dense_1"]["kernel"], 4 * np.ones((3, 1)))
  np.testing.assert_array_equal(doubled["Dense_0"]["bias"], np.zeros(3))
  replaced = kernels.set([jnp.zeros((2, 3)), jnp.zeros((3, 1))], params())
  assert not any(np.any(k) for k in kernels.iterate(replaced))
  with pytest.raises(optcore.SelectorError, match="set\\(\\) got 1 values for 2 selected"):
    kernels.set([jnp.zeros((2, 3))], params())


def test_every_selector_form_gives_the_same_mask():
  expected = {
    "Dense_0": {"kernel": True, "bias": False},
    "Dense_1": {"kernel": True, "bias": False},
    "blocks": [{"scale": False}, (False, False)],
  }
  forms = [
    optcore.ModelParamTraversal(lambda path, _: path.endswith("/kernel")),
    lambda path, value: path.endswith("/kernel"),
    r"/kernel$",
    expected,
    lambda p: jax.tree.map(lambda x: x.ndim == 2, p),
  ]
  for selector in forms:
    assert optcore.selector_mask(selector, params()) == expected, selector


def test_prefix_masks_broadcast_over_subtrees():
  mask = optcore.selector_mask({"Dense_0": True, "Dense_1": False, "blocks": True}, params())
  assert mask["Dense_0"] == {"kernel": True, "bias": True}
  assert mask["Dense_1"] == {"kernel": False, "bias": False}
  assert mask["blocks"] == [{"scale": True}, (True, True)]


def test_attribute_pytrees_use_attribute_names():
  model = {
    "layers": [Linear(jnp.ones((2, 2)), jnp.zeros(2)), Linear(jnp.ones((2, 1)), jnp.zeros(1))]
  }
  mask = optcore.selector_mask(r"^/layers/1/weight$", model)
  assert mask["layers"][1] == Linear(weight=True, bias=False)
  assert mask["layers"][0] == Linear(weight=False, bias=False)


def test_bad_masks_name_the_path():
  with pytest.raises(
    optcore.SelectorError, match=r"has 'yes' at '/Dense_0/kernel'; a mask holds booleans"
  ):
    optcore.selector_mask(
      {"Dense_0": {"kernel": "yes", "bias": True}, "Dense_1": True, "blocks": True}, params()
    )
  with pytest.raises(optcore.SelectorError, match="does not have the structure of the parameters"):
    optcore.selector_mask({"Dense_0": True}, params())
  with pytest.raises(
    optcore.SelectorError, match=r"the mask returned by the selector function has 1"
  ):
    optcore.selector_mask(lambda p: jax.tree.map(lambda _: 1, p), params())


def test_bad_regex_is_a_clear_error():
  with pytest.raises(optcore.SelectorError, match=r"'kernel\(' is not a valid regular expression"):
    optcore.selector_mask("kernel(", params())


def test_traversal_needs_a_function():
  with pytest.raises(TypeError, match=r"takes a function \(path, value\) -> bool"):
    optcore.ModelParamTraversal("kernel")
