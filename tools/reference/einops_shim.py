"""A stand-in for einops.rearrange / repeat, installed only where the real einops is missing.

The device image has PyTorch and Triton but not einops, which fla (flash-linear-attention, carried as source for the
reference benchmarks) imports. Only what fla's layers call is covered: rearrange with named axes, parenthesised groups
and one ellipsis (sizes of split groups from keyword arguments, at most one unknown per group), and repeat that adds
named axes of given sizes. Anything else raises NotImplementedError, so a silent misreading cannot happen.

    import einops_shim; einops_shim.install()     # no-op when einops imports
"""
import math
import sys
import types


def _parse(side):
    """'b (h d) ... t' -> ['b', ['h', 'd'], '...', 't']"""
    out, group = [], None
    for tok in side.replace("(", " ( ").replace(")", " ) ").split():
        if tok == "(":
            group = []
        elif tok == ")":
            out.append(group)
            group = None
        elif group is not None:
            group.append(tok)
        else:
            out.append(tok)
    for item in out:
        names = item if isinstance(item, list) else [item]
        if any(n.isdigit() and n != "1" for n in names):
            raise NotImplementedError(f"einops_shim: numeric axis in {side!r}")
    return out


def _decompose(shape, left, sizes):
    """Elementary axes of the left side: name -> size, in order; '...' keeps its dims."""
    n_named = sum(1 for item in left if item != "...")
    if "..." not in left and n_named != len(shape):
        raise ValueError(f"einops_shim: pattern has {n_named} axes, tensor {len(shape)}")
    ell = len(shape) - n_named
    axes, dim = [], 0
    for item in left:
        if item == "...":
            axes += [(f"...{i}", shape[dim + i]) for i in range(ell)]
            dim += ell
            continue
        names = item if isinstance(item, list) else [item]
        known = {n: sizes[n] for n in names if n in sizes or n == "1"} if names else {}
        known.update({n: 1 for n in names if n == "1"})
        unknown = [n for n in names if n not in known]
        if len(unknown) > 1:
            raise ValueError(f"einops_shim: cannot split {names} without sizes")
        if unknown:
            known[unknown[0]] = shape[dim] // max(1, math.prod(known.values()))
        axes += [(n, known[n]) for n in names]
        dim += 1
    return axes


def rearrange(tensor, pattern, **sizes):
    left_s, right_s = pattern.split("->")
    left, right = _parse(left_s), _parse(right_s)
    axes = _decompose(tuple(tensor.shape), left, sizes)
    names = [n for n, _ in axes]
    size = dict(axes)
    flat_right = []
    for item in right:
        if item == "...":
            flat_right += [n for n in names if n.startswith("...")]
        else:
            flat_right += [n for n in (item if isinstance(item, list) else [item]) if n != "1"]
    if sorted(flat_right) != sorted(n for n in names if size[n] != 1 or n in flat_right):
        raise NotImplementedError(f"einops_shim: {pattern!r} adds or drops axes")
    t = tensor.reshape([s for _, s in axes])
    keep = [names.index(n) for n in flat_right]
    drop = [i for i, n in enumerate(names) if n not in flat_right]
    t = t.permute(keep + drop).reshape([size[n] for n in flat_right])
    out_shape = []
    for item in right:
        if item == "...":
            out_shape += [size[n] for n in names if n.startswith("...")]
        elif isinstance(item, list):
            out_shape.append(math.prod(size[n] if n != "1" else 1 for n in item))
        else:
            out_shape.append(1 if item == "1" else size[item])
    return t.reshape(out_shape)


def repeat(tensor, pattern, **sizes):
    left_s, right_s = pattern.split("->")
    left, right = _parse(left_s), _parse(right_s)
    have = {n for item in left for n in (item if isinstance(item, list) else [item])}
    new = [n for item in right for n in (item if isinstance(item, list) else [item]) if n not in have and n != "..."]
    if any(isinstance(item, list) for item in left) or any(n not in sizes for n in new):
        raise NotImplementedError(f"einops_shim: repeat {pattern!r}")
    # Put the new axes first with size 1, expand them, then rearrange into the right side's order.
    t = tensor.reshape([1] * len(new) + list(tensor.shape)).expand([sizes[n] for n in new] + list(tensor.shape))
    return rearrange(t.contiguous(), f"{' '.join(new)} {left_s.strip()} -> {right_s.strip()}", **sizes)


def install():
    try:
        import einops  # noqa: F401
        return False
    except ImportError:
        mod = types.ModuleType("einops")
        mod.rearrange, mod.repeat = rearrange, repeat

        def _missing(*args, **kwargs):
            raise NotImplementedError("einops_shim: only rearrange and repeat")

        mod.reduce = mod.einsum = _missing
        sys.modules["einops"] = mod
        return True
