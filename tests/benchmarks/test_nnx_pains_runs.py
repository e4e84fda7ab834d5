"""benchmarks/nnx_pains.py runs each NNX pain on a face (a smoke run of `nox -s bench`, on the
8 devices of this folder's run): optcore's face holds on every one."""

from __future__ import annotations

from benchmark_scripts import benchmark_script

nnx_pains = benchmark_script("nnx_pains")


def test_every_pain_holds_on_the_face_and_each_is_reported_by_name():
  results = nnx_pains.run(nnx_pains.FACES["optcore"])
  assert list(results) == list(nnx_pains.checks())
  assert set(results.values()) == {"holds"}, results


def test_a_check_that_fails_is_reported_with_what_went_wrong():
  def refuses(*args, **kwargs):
    raise ValueError("no optimizer here\nsecond line")

  face = nnx_pains.Face("refusing", refuses, lambda: None, lambda: None)
  name = "restore into nnx.eval_shape"
  assert nnx_pains.run(face, [name]) == {name: "ValueError: no optimizer here"}
