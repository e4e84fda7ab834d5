"""The composition matrix of `tests/conformance/test_composition_matrix.py` on the 8-device
mesh: each wrapper alone and (the whole matrix) the ordered pairs that change the state's
numbers (`composition.ORDERS`), placed by each face's own shard method with
ZeRO-1 (``state_axis="data"``) and the state in host memory, against the one-device core run
(within the ulps a split step may round differently, `tree_testing.assert_trees_within_ulps`);
every state leaf stays in host memory, split over the data axis where it is parameter-shaped
(a quantized leaf: over its blocks)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from composition import CALLS, ORDERS, build, grads_for, order_id, params_for, step_arguments
from faces import FACES
from jax.sharding import Mesh
from tree_testing import assert_trees_within_ulps


@pytest.mark.parametrize("face", FACES, ids=str)
@pytest.mark.parametrize("order", ORDERS, ids=order_id)
def test_each_composition_on_the_mesh_in_every_face(order, face, cpu_devices):
  # The (2, 3) kernel: a 2-way data axis splits it, the 4-way other axis replicates.
  mesh = Mesh(np.array(cpu_devices).reshape(2, 4), ("data", "other"))
  opt_def = build(order)
  handle = face.create_sharded(
    opt_def, params_for(opt_def), mesh, state_axis="data", state_memory_kind="pinned_host"
  )
  step = face.jit(face.step)
  reference = opt_def.create(params_for(opt_def))
  one_device = jax.jit(lambda o, g, kw: o.apply_gradient(g, **kw))
  for i in range(CALLS):
    handle = step(handle, grads_for(opt_def, i), step_arguments(opt_def, face.name, i))
    reference = one_device(reference, grads_for(opt_def, i), step_arguments(opt_def, "core", i))
  assert_trees_within_ulps(face.params(handle), reference.target)
  state = [x for x in jax.tree.leaves(face.state_dict(handle)["state"]) if x.ndim]
  assert {x.sharding.memory_kind for x in state} == {"pinned_host"}
  # The kernel's state: (2, 3), or quantized in rows of one block, codes (2, 1, 3), scales (2, 1).
  kernels = [x for x in state if x.shape in {(2, 3), (2, 1, 3), (2, 1)}]
  assert kernels and all(x.addressable_shards[0].data.size < x.size for x in kernels)
