"""What a new user met (issue 50): an option that would do nothing says so, naming what matched
nothing, and a keyword spelt as another library spells it is named with optcore's keyword.

Every case is a warning or error the user can act on; the quiet cases beside each (a pattern
that matches, a model large enough) stay quiet, as the suite turns warnings into errors.
"""

from __future__ import annotations

import jax.numpy as jnp
import pytest

import optcore

BIG = {"w": jnp.ones((64, 128))}  # 8192 values: above low_bit_state's min_size of 4096
SMALL = {"w": jnp.ones((4, 3))}


def test_low_bit_state_of_an_optimizer_without_state_says_nothing_is_quantized():
  with pytest.warns(UserWarning, match=r"quantizes nothing: .*keeps no floating-point state"):
    optcore.low_bit_state(optcore.sgd(0.1)).create(BIG)


def test_a_states_pattern_that_matches_nothing_names_the_state_paths():
  with pytest.warns(
    UserWarning, match=r"states='\^0/nux/' matches no state leaf.*'0/mu/w', '0/nu/w'"
  ):
    optcore.low_bit_state(optcore.adam(0.1), states="^0/nux/").create(BIG)
  opt = optcore.low_bit_state(optcore.adam(0.1), states="^0/nu/").create(BIG)  # quiet
  assert isinstance(opt.state.param_states.inner[0].nu["w"], optcore.QuantizedArray)


def test_a_model_under_min_size_says_which_min_size_would_quantize_it():
  with pytest.warns(
    UserWarning, match=r"fewer than min_size=4096 values \(the largest 12\).*min_size=12"
  ):
    optcore.low_bit_state(optcore.adam(0.1)).create(SMALL)
  optcore.low_bit_state(optcore.adam(0.1), min_size=12).create(SMALL)  # quiet


def test_a_statistics_group_that_matches_no_parameter_is_named():
  groups = {"attention": "attn", "dense": "w"}
  with pytest.warns(UserWarning, match=r"group 'attention' \('attn'\) matches no parameter.*'/w'"):
    optcore.with_statistics(optcore.sgd(0.1), groups=groups).create(BIG)
  optcore.with_statistics(optcore.sgd(0.1), groups={"dense": "w"}).create(BIG)  # quiet


def test_statistics_groups_say_the_depth_counts_from_one():
  with pytest.raises(TypeError, match=r"path depth counted from 1 .*got groups=0"):
    optcore.with_statistics(optcore.sgd(0.1), groups=0)


def test_statistics_groups_in_another_order_are_another_program():
  """The first regex a path matches takes it, and the logged lines keep the order given: two
  orders are two definitions, so jax.jit does not reuse one's program for the other."""
  one = optcore.with_statistics(optcore.sgd(0.1), groups={"a": "w", "b": "."})
  other = optcore.with_statistics(optcore.sgd(0.1), groups={"b": ".", "a": "w"})
  assert one != other and hash(one) != hash(other)
  assert one == optcore.with_statistics(optcore.sgd(0.1), groups={"a": "w", "b": "."})


@pytest.mark.parametrize(
  ("factory", "kwargs", "named"),
  [
    (optcore.adamw, {"lr": 1e-3}, r"'lr' \(optcore's name is 'learning_rate'\)"),
    (
      optcore.adam,
      {"learning_rate": 1e-3, "betas": (0.9, 0.99)},
      r"'betas' \(optcore's names are 'b1' and 'b2'\)",
    ),
    (optcore.adam, {"learning_rate": 1e-3, "beta1": 0.9}, r"'beta1' \(optcore's name is 'b1'\)"),
    (optcore.contrib.soap, {"lr": 3e-3}, r"'lr' \(optcore's name is 'learning_rate'\)"),
  ],
)
def test_a_torch_or_keras_keyword_names_optcores(factory, kwargs, named):
  with pytest.raises(TypeError, match=r"unexpected keyword argument " + named + ".*it takes: "):
    factory(**kwargs)


def test_sgds_own_momentum_is_no_alias():
  assert optcore.sgd(0.1, momentum=0.9).hyper_params.momentum == 0.9


def test_an_override_typo_lists_only_what_a_step_can_override():
  opt = optcore.adamw(1e-3).create(SMALL)
  with pytest.raises(TypeError) as caught:
    opt.apply_gradient({"w": jnp.ones((4, 3))}, learnig_rate=1e-2)
  message = str(caught.value)
  assert "'learnig_rate' (did you mean 'learning_rate'?)" in message
  valid = message.split("the valid names are: ")[1].split(" (set when")[0]
  assert valid == "b1, b2, eps, eps_root, learning_rate, weight_decay"
  assert "(set when the definition is made, not per step: mask, mu_dtype, nesterov)" in message
  with pytest.raises(TypeError, match=r"'lr' \(optcore's name is 'learning_rate'\)"):
    opt.apply_gradient({"w": jnp.ones((4, 3))}, lr=1e-2)
