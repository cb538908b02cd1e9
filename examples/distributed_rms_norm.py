"""Tensor and sequence parallel with torchops on DTensor: a pre-norm MLP block, trained on several processes.

    torchrun --nproc_per_node 2 examples/distributed_rms_norm.py                 # GPUs (NCCL) if any, else CPU
    torchrun --nproc_per_node 2 examples/distributed_rms_norm.py --device cpu    # CPU, gloo

Each rank holds a slice of the tokens of every sequence (sequence parallel around the norm and the residual)
and a slice of the MLP's hidden units (tensor parallel), as torch's parallel styles place them: the
``torchops.nn.RMSNorm`` runs on the rank's tokens, ``torchops.swiglu`` on its hidden units and
``torchops.vector_add`` adds the residual to its tokens. Every rank also trains the same block on whole
tensors and checks that the losses and the final weights agree; rank 0 prints them.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Shard, init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

import torchops


class Block(nn.Module):
    """``x + w2(swiglu(w1(h), w3(h)))`` with ``h = RMSNorm(x)``."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = torchops.nn.RMSNorm(dim)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm(x)
        return torchops.vector_add(x, self.w2(torchops.swiglu(self.w1(h), self.w3(h))))


# Megatron / torchtitan style: tokens sharded (Shard(1)) through the norm, gathered by the column-parallel
# projections, reduce-scattered back to tokens by the row-parallel one. The rowwise layer returns the rank's
# tokens as a plain tensor, so the residual stream stays local.
PLAN = {
    "norm": SequenceParallel(),
    "w1": ColwiseParallel(input_layouts=Shard(1)),
    "w3": ColwiseParallel(input_layouts=Shard(1)),
    "w2": RowwiseParallel(output_layouts=Shard(1)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")  # torchrun sets rank, world size, address
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(args.device, (world,))
    device = torch.device(args.device, torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")

    torch.manual_seed(0)  # the same weights and data on every rank
    reference = Block(dim=64, hidden=176).to(device)
    block = parallelize_module(copy.deepcopy(reference), mesh, PLAN)
    batches = [torch.randn(4, 8 * world, 64, device=device) for _ in range(args.steps)]  # (batch, tokens, dim)

    opt, ref_opt = torch.optim.SGD(block.parameters(), lr=0.1), torch.optim.SGD(reference.parameters(), lr=0.1)
    for step, x in enumerate(batches):
        tokens = x.chunk(world, dim=1)[rank]  # this rank's tokens of every sequence
        out = block(tokens)
        loss = out.pow(2).sum() / x.numel()  # this rank's share of the mean over every token
        total = loss.detach().clone()
        dist.all_reduce(total)
        loss.backward()
        opt.step()
        opt.zero_grad()

        ref_loss = reference(x).pow(2).mean()
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        torch.testing.assert_close(total, ref_loss.detach(), rtol=1e-4, atol=1e-4)
        if rank == 0:
            print(f"step {step}: loss {total.item():.6f} on {world} ranks, {ref_loss.item():.6f} on whole tensors")

    for (name, p), (_, q) in zip(block.named_parameters(), reference.named_parameters()):
        full = p.full_tensor() if isinstance(p, DTensor) else p
        torch.testing.assert_close(full, q, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    if rank == 0:
        print(f"ok: the block trained on {world} ranks ({args.device}) matches the block trained on whole tensors")
    dist.barrier()  # every rank done with its collectives before any tears the group down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # After a clean destroy_process_group, the interpreter's own teardown still aborts now and then on gloo
    # ("terminate called without an active exception": a C++ thread destroyed at exit, pytorch #190489).
    # Everything is done by here, so leave without it.
    sys.stdout.flush()
    os._exit(0)
