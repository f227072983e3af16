"""Targets for ``tests/test_fake_gpu_reads.py``: what a read of device memory gives on the
fake GPU (imported in its child process)."""

import torch


def stale_block():
    """A block that held a host->device copy, freed and handed out again for a tensor no host
    write fills: what ``tolist`` reads from it, and from the copy before."""
    x = torch.tensor([7, 7, 7, 7], device="cuda", dtype=torch.int32)
    copied = x.tolist()
    del x
    y = torch.empty(4, device="cuda", dtype=torch.int32)  # the same block, nothing written
    return {"copied": copied, "reused": y.tolist()}


def zeroed_range():
    """A host->device copy of sevens over 3 MiB and a few bytes, then the stub's own
    ``cudaMemset`` of zero from byte 5 to 5 bytes before its end (over more than a MiB, its
    ends inside pages: the pages wholly inside given back, the rest written), and of a
    98-byte range the same way (written); what reads back, counted by value. (Whether
    ``zero_()`` reaches ``cudaMemset`` depends on the build: 2.15's does, 2.14.1's launches
    a fill kernel, which does nothing here.)"""
    import ctypes

    memset = ctypes.CDLL(None).cudaMemset  # the stub's: LD_PRELOAD put it first
    memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    got = {}
    for name, n in (("big", 3 * 2**20 + 13), ("small", 108)):
        x = torch.full((n,), 7, dtype=torch.uint8).to("cuda")
        torch.cuda.synchronize()
        assert memset(x.data_ptr() + 5, 0, n - 10) == 0
        counts = torch.bincount(x.cpu(), minlength=8).tolist()
        got[name] = {"7": counts[7], "0": counts[0]}
    return got


def host_reads():
    """The value reads a step makes: a boolean ``all`` (transformers'
    ``find_packed_sequence_indices``), ``.item()`` of a sum, a mask's count (``nonzero``)."""
    m = torch.arange(6, device="cuda").view(2, 3)
    return {"all": bool((m[:, -1] == 0).all()),
            "item": torch.randn(3, device="cuda").sum().item(),
            "nonzero": int(torch.randn(5, device="cuda").gt(0).nonzero().shape[0])}


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x)


def grad_scaler_step():
    """torch.amp.GradScaler as written: its ``found_inf`` (``torch.full((), 0.0)``, then an
    inf check that computes nothing) reads 0, so the optimizer step runs and makes its state;
    ``get_scale()`` reads 0.0 (the fill did not run)."""
    net = _Net().cuda()
    opt = torch.optim.Adam(net.parameters())
    scaler = torch.amp.GradScaler("cuda")
    for _ in range(2):  # the second step's blocks are reused ones
        with torch.autocast("cuda", dtype=torch.float16):
            loss = net(torch.randn(2, 8, device="cuda")).float().sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    return {"steps": [int(s["step"]) for s in opt.state.values()],
            "scale": scaler.get_scale()}
