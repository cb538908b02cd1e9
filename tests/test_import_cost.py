"""`import torchops` stays cheap: it must not import torch._dynamo (about a second on a small machine), yet
torch.compile must still trace every wrapper to its OpOverloads, whichever of the two is imported first.
Each check runs in a fresh interpreter, where nothing has been imported yet."""

from __future__ import annotations

import json

import pytest

from helpers import run_python

_TIMING = """
    import json, sys, time
    t0 = time.perf_counter()
    import torch
    t1 = time.perf_counter()
    import torchops
    t2 = time.perf_counter()
    print(json.dumps({"torch": t1 - t0, "torchops": t2 - t1, "dynamo": "torch._dynamo" in sys.modules,
                      "inductor": "torch._inductor" in sys.modules,
                      "dtensor": "torch.distributed.tensor" in sys.modules}))
"""


def test_import_torchops_does_not_import_dynamo_and_costs_little() -> None:
    runs = [json.loads(run_python(_TIMING).splitlines()[-1]) for _ in range(3)]
    assert not any(r["dynamo"] or r["inductor"] for r in runs), "import torchops must not import torch._dynamo"
    assert not any(r["dtensor"] for r in runs), "import torchops must not import torch.distributed.tensor"
    torch_s, torchops_s = min(r["torch"] for r in runs), min(r["torchops"] for r in runs)
    print(f"import torch {torch_s:.3f} s, then import torchops {torchops_s:.3f} s (min of {len(runs)} fresh processes)")
    # Relative to torch's own import, so a loaded machine slows both alike: torch._dynamo alone costs
    # about half of `import torch`, the extension and fake kernels a few percent.
    assert torchops_s < 0.25 * torch_s, f"import torchops took {torchops_s:.3f} s after {torch_s:.3f} s for torch"


# Every public wrapper, compiled with fullgraph=True: one graph calling the OpOverloads, the eager result.
_COMPILE_EVERY_WRAPPER = """
    import sys
    import torch
    {first}
    import torch._dynamo.testing

    if {check_hook}:
        import torchops._after_import
        assert "torch._dynamo" not in torchops._after_import.pending_modules(), "registration left waiting"
        assert type(torch._dynamo.__spec__.loader).__name__ == "SourceFileLoader", torch._dynamo.__spec__.loader
        assert torch._dynamo.__loader__ is torch._dynamo.__spec__.loader

    x, y, buf = torch.randn(4, 6), torch.randn(4, 6), torch.empty(4, 6)
    w = torch.randn(6)
    crow, col = torch.tensor([0, 2, 2, 3]), torch.tensor([0, 2, 1])
    values, dense = torch.randn(3), torch.randn(3, 5)
    A = torch.sparse_csr_tensor(crow, col, values, (3, 3))
    cases = {{
        "vector_add": (lambda x, y: torchops.vector_add(x, y), (x, y), ["myns.vector_add.default"]),
        "vector_add out=": (lambda x, y, buf: torchops.vector_add(x, y, out=buf), (x, y, buf),
                            ["myns.vector_add_out.default"]),
        "swiglu": (lambda x, y: torchops.swiglu(x, y), (x, y), ["myns.swiglu.default"]),
        "rms_norm": (lambda x, w: torchops.rms_norm(x, w, 1e-5), (x, w), ["myns.rms_norm.default"]),
        "csr_spmm": (lambda *a: torchops.csr_spmm(*a), (crow, col, values, dense), ["myns.csr_spmm.default"]),
        "add_rms_norm": (lambda x, y, w: torchops.add_rms_norm(x, y, w, weight_offset=1.0), (x, y, w),
                         ["myns.add_rms_norm.default"]),
    }}
    for name, (fn, args, expected_ops) in cases.items():
        torch._dynamo.reset()
        graphs = torch._dynamo.testing.EagerAndRecordGraphs()
        got = torch.compile(fn, backend=graphs, fullgraph=True)(*args)
        torch.testing.assert_close(got, fn(*args))
        assert len(graphs.graphs) == 1, name
        called = [str(n.target) for n in graphs.graphs[0].graph.nodes if n.op == "call_function"]
        assert [c for c in called if c.startswith("myns.")] == expected_ops, (name, called)
    # dynamo does not take sparse tensors (it breaks the graph there), so spmm runs eagerly, cache and all.
    torch._dynamo.reset()
    d = dense.detach().requires_grad_()
    torch.compile(lambda A, d: torchops.spmm(A, d) * 2, backend="eager")(A, d).sum().backward()
    torch.testing.assert_close(d.grad, 2 * A.to_dense().t() @ torch.ones(3, 5))
    print("ok")
"""


@pytest.mark.slow
@pytest.mark.parametrize("first", ["torchops", "torch._dynamo"])
def test_compile_traces_every_wrapper_whichever_is_imported_first(first: str) -> None:
    if first == "torchops":
        # The import hook registers the traced twins when torch._dynamo is imported later, then leaves.
        code = _COMPILE_EVERY_WRAPPER.format(
            first="import torchops\n    assert 'torch._dynamo' not in sys.modules", check_hook=True)
    else:
        code = _COMPILE_EVERY_WRAPPER.format(first="import torch._dynamo\n    import torchops", check_hook=False)
    assert run_python(code).splitlines()[-1] == "ok"


def test_sharding_rules_register_when_dtensor_is_imported_later() -> None:
    # torchops.distributed (DTensor sharding rules) loads with torch.distributed.tensor, in either order.
    for first, second in (("torchops", "torch.distributed.tensor"), ("torch.distributed.tensor", "torchops")):
        out = run_python(f"""
            import sys, torch
            import {first}
            import {second}
            import torchops._after_import
            assert "torchops.distributed" in sys.modules
            assert "torch.distributed.tensor" not in torchops._after_import.pending_modules()
            print("ok")
        """)
        assert out.strip().endswith("ok"), (first, second)
