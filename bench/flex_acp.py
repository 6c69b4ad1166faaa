"""FlexAttention FoX with the ACP block mask: the peer that bench/peers.py races and that
examples/train_fox.py trains with (one definition for both).

- `gate_cumsum(fgate)`: c[t] = sum_{l <= t} max(logsigmoid(z_l), -100) in f32 (SEMANTICS.md
  gate_cumsum Logits).
- `block_starts(c, delta, bm, bn)`: the first kept key tile of each query tile under the block
  rule (SEMANTICS.md block_boundary) for a per-(b, h) threshold delta.
- `acp_block_mask(...)`: a `BlockMask.from_kv_blocks` from those starts (diagonal tile partial
  with a causal mask_mod, tiles from start to the diagonal full).
- `fox_score_mod(cq, ck)`: score + cq[b, h, q] - ck[b, h, kv]. For the gate's gradient pass two
  different tensors (e.g. `c` and `c.clone()`): FlexAttention (PyTorch 2.11) refuses to
  differentiate one tensor indexed twice in a score_mod ("multiple indexing operations on the
  same tensor that requires gradients").
"""

import math

import torch
import torch.nn.functional as F

LOG_F_FLOOR = -100.0


def gate_cumsum(fgate):
    """c[t] = sum_{l <= t} max(logsigmoid(z_l), -100), in f32."""
    return torch.cumsum(F.logsigmoid(fgate.float()).clamp_min(LOG_F_FLOOR), dim=-1)


def paper_delta(u, log_eps, T):
    """The paper's threshold from a bound u >= max |score| per (b, h): ln eps - 2 u - ln T."""
    return log_eps - 2.0 * u - math.log(T)


def qk_bound(qn, kn, group=1):
    """u = scale * max|q_i| * max|k_j| per (b, h) (k read at the query head's kv head)."""
    D = qn.shape[-1]
    qmax = qn.float().norm(dim=-1).amax(dim=-1)
    kmax = kn.float().norm(dim=-1).amax(dim=-1).repeat_interleave(group, dim=1)
    return qmax * kmax / math.sqrt(D)


def block_starts(c, delta, bm, bn):
    """start[b, h, m] of the block rule for a per-(b, h) delta, and the diagonal tile of each m."""
    B, H, T = c.shape
    mt = (T + bm - 1) // bm
    nt = (T + bn - 1) // bn
    i0 = torch.arange(mt, device=c.device) * bm
    jend = torch.clamp(torch.arange(nt, device=c.device) * bn + bn - 1, max=T - 1)
    ci = c[:, :, i0]  # [B, H, Mt]
    cj = c[:, :, jend]  # [B, H, Nt]
    keep = (ci[..., :, None] - cj[..., None, :]) >= delta[..., None, None]  # [B, H, Mt, Nt]
    # The first kept n (keep is monotone in n); none kept -> nt.
    idx = torch.arange(nt, device=c.device).expand_as(keep)
    first = torch.where(keep, idx, torch.full_like(idx, nt)).min(dim=-1).values
    diag = i0 // bn
    return torch.minimum(first, diag.expand_as(first)), diag


def kept_fraction(start, bm, bn, T):
    """Kept causal tiles / all causal tiles."""
    i0 = torch.arange(start.shape[-1], device=start.device) * bm
    diag = torch.clamp(i0 + bm - 1, max=T - 1) // bn
    kept = (diag - start + 1).sum().item()
    total = ((diag + 1).sum() * start.shape[0] * start.shape[1]).item()
    return kept / total


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def acp_block_mask(start, T, bm, bn):
    """The BlockMask of the kept tiles: the diagonal tile partial (causal), start..diagonal-1 full."""
    from torch.nn.attention.flex_attention import BlockMask

    B, H, mt = start.shape
    dev = start.device
    nt = (T + bn - 1) // bn
    diag = (torch.arange(mt, device=dev) * bm) // bn
    kv_num = torch.ones(B, H, mt, dtype=torch.int32, device=dev)
    kv_idx = torch.zeros(B, H, mt, nt, dtype=torch.int32, device=dev)
    kv_idx[..., 0] = diag.to(torch.int32)
    full_num = (diag - start).clamp_min(0).to(torch.int32)
    full_idx = torch.clamp(start[..., None] + torch.arange(nt, device=dev), max=nt - 1).to(torch.int32)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=(bm, bn), mask_mod=_causal, seq_lengths=(T, T)
    )


def causal_block_mask(T, device, block=128):
    """The dense causal BlockMask."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(_causal, B=None, H=None, Q_LEN=T, KV_LEN=T, device=device, BLOCK_SIZE=block)


def fox_score_mod(cq, ck):
    """score + cq[b, h, q] - ck[b, h, kv] (pass two tensors for the gate's gradient)."""

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + (cq[b, h, q_idx] - ck[b, h, kv_idx])

    return score_mod
