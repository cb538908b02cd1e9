"""Lazy math bits (negative and conjugate views such as ``z.conj().imag``) on the ops' arguments.

Every mutable myns op has its own kernels for the Negative and Conjugate keys (csrc/core/math_bits.cpp):
PyTorch's fallback for those keys assumes an out= op returns its out, tripped an internal assert on ours
and left the process corrupt. These tests check the values against the same calls on plain tensors, run
the original crash in a fresh process, and audit that every mutable op, now and later, has the kernels.
"""

from __future__ import annotations

import pytest
import torch

import torchops
from helpers import DEVICES, run_python


def myns_ops() -> list[str]:
    return sorted(name for name in torch._C._dispatch_get_all_op_names() if name.startswith("myns::"))


def neg_view(values: torch.Tensor) -> torch.Tensor:
    """A real view with the negative bit whose logical values are `values`."""
    z = torch.complex(torch.zeros_like(values), -values)
    view = z.conj().imag  # imag of the conjugate: the negated imaginary part, lazily
    assert view.is_neg()
    torch.testing.assert_close(view, values, equal_nan=True)
    return view


@pytest.mark.parametrize("device", DEVICES)
def test_out_with_the_negative_bit(device: str) -> None:
    a, b = torch.randn(5, 3, device=device), torch.randn(5, 3, device=device)
    out = neg_view(torch.full((5, 3), float("nan"), device=device))
    assert torchops.vector_add(a, b, out=out) is out
    assert out.is_neg()
    torch.testing.assert_close(out, a + b)


@pytest.mark.parametrize("device", DEVICES)
def test_write_through_the_view_reaches_its_base(device: str) -> None:
    a, b = torch.randn(7, device=device), torch.randn(7, device=device)
    z = torch.zeros(7, dtype=torch.complex64, device=device)
    out = z.conj().imag
    torchops.vector_add(a, b, out=out)
    torch.testing.assert_close(z.imag, -(a + b))  # conj().imag is minus z's imaginary part
    torch.testing.assert_close(z.real, torch.zeros(7, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_inputs_with_the_negative_bit(device: str) -> None:
    a_values, b_values = torch.randn(4, 6, device=device), torch.randn(4, 6, device=device)
    a, b = neg_view(a_values), neg_view(b_values)
    assert torch.equal(torchops.vector_add(a, b), a_values + b_values)
    out = torch.empty(4, 6, device=device)
    torchops.vector_add(a, b_values, out=out)
    assert torch.equal(out, a_values + b_values)
    assert torch.equal(torchops.swiglu(a, b), torchops.swiglu(a_values, b_values))


@pytest.mark.parametrize("device", DEVICES)
def test_out_aliasing_an_input_with_the_bit(device: str) -> None:
    values, b = torch.randn(9, device=device), torch.randn(9, device=device)
    x = neg_view(values.clone())
    torchops.vector_add(x, b, out=x)  # in place, through the negative view
    torch.testing.assert_close(x, values + b)
    y = neg_view(values.clone())
    torchops.vector_add(b, y, out=y)
    torch.testing.assert_close(y, b + values)


@pytest.mark.parametrize("device", DEVICES)
def test_out_is_a_plain_view_of_an_input_with_the_bit(device: str) -> None:
    # out (no bit) and a (negative view) are two views of one complex tensor's imaginary part: the result
    # is what the same values give, and out holds it afterwards.
    z = torch.complex(torch.randn(6, device=device), torch.randn(6, device=device))
    a = z.conj().imag  # -z.imag, lazily
    out = z.imag
    a_values, b = a.clone(), torch.randn(6, device=device)
    torchops.vector_add(a, b, out=out)
    torch.testing.assert_close(out, a_values + b)


@pytest.mark.parametrize("device", DEVICES)
def test_conjugate_out_of_an_unsupported_dtype_is_refused_cleanly(device: str) -> None:
    z = torch.randn(3, dtype=torch.complex64, device=device).conj()
    assert z.is_conj()
    with pytest.raises(RuntimeError, match=r"myns::vector_add_out: a has unsupported dtype ComplexFloat"):
        torchops.vector_add(z, z, out=z)
    # And again: the process is intact.
    with pytest.raises(RuntimeError, match=r"myns::vector_add_out: a has unsupported dtype ComplexFloat"):
        torchops.vector_add(z, z, out=z)


def test_original_crash_in_a_fresh_process() -> None:
    # The reported sequence: an out with the negative bit, the same call again, then a formatted traceback
    # (which used to segfault); exit status 0 and correct values each time.
    stdout = run_python(
        """
        import traceback
        import torch, torchops

        a, b = torch.randn(4), torch.randn(4)
        z = torch.zeros(4, dtype=torch.complex64)
        for _ in range(2):
            out = z.conj().imag
            assert torchops.vector_add(a, b, out=out) is out
            assert torch.equal(out, a + b), (out, a + b)
            assert torch.equal(torchops.vector_add(a, b), a + b)  # two f32 tensors: no dtype error
        try:
            torchops.vector_add(a, b.double(), out=z.conj().imag)
        except RuntimeError:
            text = traceback.format_exc()
            assert "myns::vector_add_out: a and b must have the same dtype" in text, text
        else:
            raise AssertionError("a dtype mismatch was accepted")
        print("survived")
        """
    )
    assert stdout.strip() == "survived"


@pytest.mark.parametrize("qualname", myns_ops())
def test_every_mutable_op_has_math_bits_kernels(qualname: str) -> None:
    # Any op whose schema writes an argument, present or future, must not reach PyTorch's fallback.
    packet = getattr(torch.ops.myns, qualname.removeprefix("myns::"))
    for overload in packet.overloads():
        if not getattr(packet, overload)._schema.is_mutable:
            continue
        for key in ("Negative", "Conjugate"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key), f"{qualname}: no {key} kernel"


def test_the_audit_sees_a_mutable_op() -> None:
    # The audit above must not pass vacuously.
    assert any(getattr(torch.ops.myns, name.removeprefix("myns::")).default._schema.is_mutable for name in myns_ops())
