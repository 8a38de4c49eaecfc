"""Op classes of the side-by-side profile (profile.py): where a training step's time goes,
counted in the same classes on both sides.

- PyTorch: every GPU kernel of a torch.profiler trace (on a CPU: every op's self time),
  classified by its name and by the ops that launched it (KERNEL_RULES, first match wins).
- gpipe-onnx: every layer of its per-layer profile (`gpipe-onnx balance --profile-out`), by
  its ONNX op type (ONNX_CLASS), forward and backward apart.

    python3 bench/op_classes.py      checks the tables on known kernel names and small traces

Imports no torch (the trace is the profiler's Chrome trace JSON), runs under Python 3.7+.
"""
import json
import re
import sys

# --------------------------------------------------------------------------
# The classes, in the table's order
# --------------------------------------------------------------------------
CLASSES = [
    ("conv_fwd", "convolution forward"),
    ("conv_dgrad", "convolution data gradient (dgrad)"),
    ("conv_wgrad", "convolution weight gradient (wgrad)"),
    ("conv_bwd_unattributed", "convolution backward, kernel neither dgrad nor wgrad by name or position"),
    ("gemm", "matrix products (GEMM, MatMul, Linear), forward and backward"),
    ("attention", "fused attention (SDPA: flash, memory-efficient, cuDNN), forward and backward"),
    ("norm", "normalization (batch, layer, instance), forward and backward"),
    ("softmax", "softmax, forward and backward"),
    ("elementwise", "elementwise and activations (ReLU, add, mul, GELU, dropout, where, ...)"),
    ("reduction", "reductions (sum, mean, max)"),
    ("pooling", "pooling and resizing (max pool, global average pool, upsample)"),
    ("embedding", "embedding and gather, forward and backward"),
    ("copies", "copies, casts, layout conversions (memcpy, memset, fill, concat, transpose, NCHW<->NHWC)"),
    ("other", "other"),
    ("loss", "loss (cross-entropy, BCE with logits), forward and backward"),
    ("optimizer", "optimizer (SGD with momentum)"),
    ("idle", "idle gaps (device waiting: no kernel running)"),
]
CLASS_LABEL = dict(CLASSES)
CLASS_KEYS = [k for k, _ in CLASSES]
CONV_BWD = ("conv_dgrad", "conv_wgrad", "conv_bwd_unattributed")

# --------------------------------------------------------------------------
# PyTorch: kernels (and CPU ops) by name and by launching op
# --------------------------------------------------------------------------
# Each rule: (class, NAME, OPS, why). NAME is searched in the kernel's name (case ignored);
# OPS must match one of the ops the kernel was launched from, the innermost and every op
# around it (torch.profiler links each CUDA kernel to its launch, which lies inside the
# ATen ops and autograd nodes that issued it: aten::convolution_backward inside
# ConvolutionBackward0, ...). A rule with both needs both. The first matching rule
# decides: definite kernel names first, then the launching ops from the most to the least
# specific, then names alone (torch.compile's Triton kernels, kernels no op is known for).
# On a CPU a unit is an op's self time, its name the op's, and OPS includes the op itself.
#
# `conv_bwd` is a placeholder: a kernel of a convolution backward op is a data gradient or a
# weight gradient by its name (cuDNN's say dgrad or wgrad), else by its position in the op:
# ATen's cudnn_convolution_backward computes the data gradient, then the weight gradient,
# so a kernel before a dgrad kernel belongs to the data gradient and one after a wgrad
# kernel to the weight gradient (split_conv_backward); the rest is conv_bwd_unattributed.
_CONV_BWD_OPS = (r"^aten::(convolution_backward|convolution_backward_overrideable|cudnn_convolution_backward\w*"
                 r"|cudnn_convolution_transpose_backward\w*|mkldnn_convolution_backward\w*"
                 r"|_slow_conv2d_backward|slow_conv_dilated[23]d_backward|_conv_depthwise2d_backward"
                 r"|conv_depthwise3d_backward|miopen_convolution\w*backward\w*)$"
                 r"|^(ConvolutionBackward0|CudnnConvolutionBackward0|ConvolutionBackwardOverrideable0)$")
KERNEL_RULES = [
    # -- definite by name ----------------------------------------------------------------
    ("copies", r"^Memcpy|^Memset", None,
     "kineto's names of copy and memset activities ('Memcpy DtoD (Device -> Device)', 'Memset (Device)')"),
    ("copies", r"nchwToNhwc|nhwcToNchw|nchw2nhwc|nhwc2nchw|NCHWToNHWC|NHWCToNCHW", None,
     "cuDNN's and cuBLAS's layout conversions, launched inside a convolution or matmul"),
    # -- by launching op, most specific first ------------------------------------------------
    ("optimizer", None, r"^Optimizer\.(step|zero_grad)#|^aten::_foreach_|^aten::_fused_sgd",
     "everything in the optimizer's step (torch.optim records 'Optimizer.step#SGD.step'); "
     "SGD runs as _foreach_ ops on multi_tensor_apply kernels"),
    ("copies", None,
     r"^aten::(copy_|_copy_from|_copy_from_and_resize|_to_copy|to|contiguous|clone|cat|_cat|stack"
     r"|repeat|expand_as|index_copy_?|fill_|zero_|zeros|zeros_like|ones_like|new_zeros|full"
     r"|constant_pad_nd|flip|roll)$|^(CloneBackward0|CatBackward0)$",
     "copies and casts wherever they are: autocast's casts of weights and inputs, .contiguous() "
     "of a layout conversion, a gradient's zeroing (fill, memset)"),
    ("loss", None,
     r"^aten::(cross_entropy_loss|nll_loss|nll_loss_nd|nll_loss_forward|nll_loss_backward|nll_loss2d"
     r"|nll_loss2d_forward|nll_loss2d_backward|log_softmax|_log_softmax|_log_softmax_backward_data"
     r"|binary_cross_entropy_with_logits|binary_cross_entropy|binary_cross_entropy_backward)$"
     r"|^(NllLossBackward0|NllLoss2DBackward0|LogSoftmaxBackward0|BinaryCrossEntropyWithLogitsBackward0"
     r"|BinaryCrossEntropyBackward0)$",
     "F.cross_entropy (log_softmax + nll_loss) and F.binary_cross_entropy_with_logits, forward and backward"),
    ("attention", None,
     r"^aten::(scaled_dot_product_attention|_scaled_dot_product_\w+|_flash_attention_forward"
     r"|_flash_attention_backward|_efficient_attention_forward|_efficient_attention_backward|_cudnn_attention\w*)$"
     r"|^ScaledDotProduct\w*Backward\d$",
     "F.scaled_dot_product_attention (GPT-2's best-layout column), whatever backend it picks"),
    ("conv_bwd", None, _CONV_BWD_OPS, "a convolution's backward: dgrad or wgrad (see split_conv_backward)"),
    ("conv_fwd", None,
     r"^aten::(conv[123]d|convolution|_convolution|convolution_overrideable|cudnn_convolution|cudnn_convolution_relu"
     r"|cudnn_convolution_add_relu|mkldnn_convolution|thnn_conv2d|_slow_conv2d_forward|slow_conv_dilated[23]d"
     r"|_conv_depthwise2d|conv_depthwise3d|conv_transpose[123]d|cudnn_convolution_transpose|miopen_convolution)$",
     "a convolution's forward (after the backward rule: a backward never runs inside a forward op)"),
    ("norm", None,
     r"^aten::(batch_norm|_batch_norm_impl_index|_batch_norm_impl_index_backward|native_batch_norm"
     r"|native_batch_norm_backward|cudnn_batch_norm|cudnn_batch_norm_backward|miopen_batch_norm"
     r"|miopen_batch_norm_backward|_native_batch_norm_legit\w*|batch_norm_\w+|instance_norm|layer_norm"
     r"|native_layer_norm|native_layer_norm_backward|group_norm|native_group_norm|native_group_norm_backward)$"
     r"|^(NativeBatchNormBackward0|CudnnBatchNormBackward0|MiopenBatchNormBackward0|NativeLayerNormBackward0"
     r"|NativeGroupNormBackward0)$",
     "BatchNorm, LayerNorm and InstanceNorm (which ATen runs as a batch norm of the reshaped input)"),
    ("softmax", None, r"^aten::(softmax|_softmax|_softmax_backward_data|_masked_softmax|_masked_softmax_backward)$"
     r"|^SoftmaxBackward0$", "the attention's softmax (log_softmax is the loss's, matched above)"),
    ("pooling", None,
     r"^aten::(max_pool[123]d|max_pool[123]d_with_indices|max_pool[123]d_with_indices_backward|avg_pool[123]d"
     r"|avg_pool[123]d_backward|adaptive_avg_pool[123]d|_adaptive_avg_pool[123]d|_adaptive_avg_pool[123]d_backward"
     r"|adaptive_max_pool[123]d|adaptive_max_pool[123]d_backward|upsample_\w+|_upsample_\w+)$"
     r"|^(MaxPool[123]DWithIndicesBackward0|AvgPool[123]DBackward0|AdaptiveAvgPool[123]DBackward0"
     r"|AdaptiveMaxPool[123]DBackward0|Upsample\w*Backward\d|MeanBackward1)$",
     "max pool, average pools, nearest upsample; torchvision's AdaptiveAvgPool2d(1) runs as aten::mean "
     "on the GPU and its backward is MeanBackward1, the only mean of the three models outside their losses"),
    ("embedding", None,
     r"^aten::(embedding|embedding_backward|embedding_dense_backward|_embedding_bag\w*|embedding_renorm_"
     r"|index_select|index_select_backward|gather|index|index_add_|index_put_|_index_put_impl_)$"
     r"|^(EmbeddingBackward0|IndexSelectBackward0|GatherBackward0|IndexBackward0)$",
     "GPT-2's token and position embeddings; their backward sorts the indices (cub radix sort kernels)"),
    ("gemm", None,
     r"^aten::(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|_addmm_activation|addmv|mv|dot)$"
     r"|^(MmBackward0|AddmmBackward0|BmmBackward0|BaddbmmBackward0|AddbmmBackward0|MvBackward0|LinearBackward0)$",
     "matrix products and what runs inside them (the bias gradient's reduction of AddmmBackward0: "
     "gpipe-onnx's Gemm backward computes it too)"),
    ("elementwise", None,
     r"^aten::(dropout|native_dropout|native_dropout_backward|_fused_dropout|_masked_scale|feature_dropout|relu"
     r"|relu_|threshold_backward|gelu|gelu_backward|leaky_relu|leaky_relu_|leaky_relu_backward|softplus"
     r"|softplus_backward|masked_fill|masked_fill_|where|add|add_|sub|rsub|mul|mul_|div|div_|neg|erf|tanh"
     r"|sigmoid|silu|pow|sqrt|rsqrt|exp|log)$",
     "pointwise ops (most are also recognized by their kernels' names below)"),
    ("reduction", None, r"^aten::(sum|mean|amax|amin|max|min|norm|linalg_vector_norm|std|var|var_mean|argmax"
     r"|argmin|prod|all|any)$", "reductions outside the ops above"),
    # -- by name alone: compiled (Triton) kernels, kernels no launching op is known for ------
    ("optimizer", r"multi_tensor_apply|_foreach_|FusedSgd", None, "torch.optim's foreach kernels"),
    ("loss", r"^triton_\w*(nll_loss|log_softmax|cross_entropy|binary_cross_entropy)", None,
     "Inductor names a Triton kernel after the ATen ops it fuses (triton_poi_fused_..., triton_red_..., "
     "triton_per_...); a fused kernel counts in the first class of this list its name holds"),
    ("norm", r"^triton_\w*(batch_norm|layer_norm|group_norm|instance_norm)", None, "see above"),
    ("softmax", r"^triton_\w*_softmax", None, "see above"),
    ("pooling", r"^triton_\w*(max_pool|avg_pool|upsample)", None, "see above"),
    ("embedding", r"^triton_\w*embedding", None, "see above"),
    ("gemm", r"^triton_tem_\w*(mm|addmm|bmm)", None, "max-autotune's Triton GEMM templates"),
    ("copies", r"^triton_poi_fused_(_to_copy_|clone_|cat_|permute_|copy_|transpose_|view_|_unsafe_view_|zeros_"
     r"|fill_|constant_pad_nd_)+\d+$", None, "a Triton kernel that only copies, casts or concatenates"),
    ("elementwise", r"^triton_poi_", None, "Triton pointwise kernels"),
    ("reduction", r"^triton_(red|per)_", None, "Triton reductions (persistent or not)"),
    ("conv_dgrad", r"dgrad", None,
     "cuDNN's data-gradient kernels: sm80_xmma_dgrad_implicit_gemm..., sm90_xmma_dgrad..., dgrad_engine, "
     "dgrad2d_alg1_1, CUTLASS ...dgrad..."),
    ("conv_wgrad", r"wgrad", None,
     "cuDNN's weight-gradient kernels: sm80_xmma_wgrad_implicit_gemm..., wgrad_alg0_engine, wgrad2d..., "
     "CUTLASS ...wgrad..."),
    ("conv_fwd", r"fprop|implicit_convolve|convolve_sgemm|conv2d_grouped|winograd|fft2d_r2c|cudnn::\w*conv", None,
     "cuDNN's forward kernels: sm80_xmma_fprop_implicit_gemm..., sm90_xmma_fprop..., implicit_convolve_sgemm, "
     "Winograd and FFT"),
    ("attention", r"flash_fwd|flash_bwd|fmha|_sdpa|attention", None,
     "flash attention, CUTLASS's memory-efficient attention (fmha_cutlassF/B), cuDNN's fused SDPA"),
    ("gemm", r"gemm|gemv|nvjet|cublas|\bdot_kernel|splitKreduce|Kernel2<cutlass|cutlass.*tensorop", None,
     "cuBLAS and cuBLASLt (ampere_sgemm..., sm90_xmma_gemm..., nvjet_tst..., splitKreduce), CUTLASS GEMMs"),
    ("norm", r"batch_norm|batchnorm|bn_fw|bn_bw|layer_norm|layernorm|instance_norm|welford|GammaBeta"
     r"|ApplyLayerNorm|RowwiseMoments", None, "ATen's and cuDNN's normalization kernels"),
    ("softmax", r"softmax", None, "softmax_warp_forward, cunn_SoftMaxForward, ..."),
    ("pooling", r"pool|upsample", None, "max_pool_forward_nchw, upsample_nearest2d, ..."),
    ("embedding", r"embedding|indexSelect|index_select|indexing_backward", None, "gathers and their backward"),
    ("elementwise", r"elementwise|dropout|relu|gelu|threshold|softplus|where|masked_fill|leaky|tanh|sigmoid"
     r"|silu|pointwise", None, "ATen's vectorized_elementwise_kernel / unrolled_elementwise_kernel (the "
                             "functor in the name: CUDAFunctor_add, ...), fused dropout"),
    ("reduction", r"reduce|reduction", None, "ATen's reduce_kernel"),
    ("copies", r"copy|fill|transpose|permute|CatArray|concat|convert|(?<![a-z])cast", None,
     "direct_copy_kernel_cuda, FillFunctor, CatArrayBatchedCopy, ..."),
]
_RULES = [(c, re.compile(n, re.I) if n else None, re.compile(o) if o else None, w) for c, n, o, w in KERNEL_RULES]
_CONV_BWD_RE = re.compile(_CONV_BWD_OPS)
_DGRAD_RE = re.compile(r"dgrad|backward_data|bwd_data", re.I)
_WGRAD_RE = re.compile(r"wgrad|backward_filter|bwd_filter|backward_weight", re.I)
_ENGINE = "autograd::engine::evaluate_function: "


def classify(name, ops):
    """(class, rule index) of a kernel called `name` launched inside `ops` (names of the
    launching op and every op around it, in any order). Rule -1: no rule matched."""
    for i, (cls, name_re, op_re, _) in enumerate(_RULES):
        if name_re is not None and not name_re.search(name):
            continue
        if op_re is not None and not any(op_re.search(o) for o in ops):
            continue
        return cls, i
    return "other", -1


def split_conv_backward(labels):
    """Per kernel of one convolution backward op, in the order they ran: 'd' (its name says
    data gradient), 'w' (weight gradient) or '?'. ATen's cudnn_convolution_backward runs the
    data gradient before the weight gradient, so a '?' before some 'd' is part of the data
    gradient and one after some 'w' part of the weight gradient; others stay '?'.
    Returns a list of (class, how) with how 'name', 'position' or 'none'."""
    out = []
    for i, lab in enumerate(labels):
        if lab == "d":
            out.append(("conv_dgrad", "name"))
        elif lab == "w":
            out.append(("conv_wgrad", "name"))
        elif "d" in labels[i + 1:]:
            out.append(("conv_dgrad", "position"))
        elif "w" in labels[:i]:
            out.append(("conv_wgrad", "position"))
        else:
            out.append(("conv_bwd_unattributed", "none"))
    return out


# --------------------------------------------------------------------------
# Reading a torch.profiler Chrome trace
# --------------------------------------------------------------------------
# Categories (kineto's; older releases capitalized some). The legacy profiler of a torch built
# without kineto (CPU-only builds of some distributions) writes no categories at all: every
# event is an op.
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
LAUNCH_CATS = {"cuda_runtime", "runtime", "cuda_driver"}
HOST_CATS = {"cpu_op", "operator", "user_annotation", ""}


def load_trace(path):
    with open(path) as f:
        doc = json.load(f)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def _arg(e, key):
    """An event's argument, the key's case ignored (kineto wrote 'external id' for GPU
    activities in older releases, 'External id' everywhere in newer ones)."""
    args = e.get("args") or {}
    if key in args:
        return args[key]
    low = key.lower()
    for k, v in args.items():
        if k.lower() == low:
            return v
    return None


class _Node:
    __slots__ = ("name", "ts", "end", "cat", "parent", "children_dur", "marker")

    def __init__(self, name, ts, end, cat, marker):
        self.name, self.ts, self.end, self.cat, self.marker = name, ts, end, cat, marker
        self.parent = None
        self.children_dur = 0.0


def _nest(nodes):
    """Sets each host node's parent: the innermost node of the same thread whose interval
    holds it (ops nest on their thread; a launch lies inside the op that issued it)."""
    eps = 0.005   # microseconds: kineto's nanosecond times rounded apart
    by_thread = {}
    for key, n in nodes:
        by_thread.setdefault(key, []).append(n)
    for lst in by_thread.values():
        lst.sort(key=lambda n: (n.ts, -n.end))
        stack = []
        for n in lst:
            while stack and n.end > stack[-1].end + eps:
                stack.pop()
            if stack:
                n.parent = stack[-1]
                stack[-1].children_dur += n.end - n.ts
            stack.append(n)


def _chain(n):
    """n and every node around it, innermost first."""
    out = []
    while n is not None:
        out.append(n)
        n = n.parent
    return out


def _union(intervals):
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def analyze_trace(events, steps, step_marker):
    """Time per step and class of a trace of `steps` training steps, each inside a
    record_function whose name starts with `step_marker`. With device activities (a CUDA
    trace), the units are the kernels, copies and memsets on the GPU, the step is the span
    from the first one's start to the last one's end divided by `steps`, idle the part of it
    with nothing running. Without (a CPU run), the units are the ops' self times and idle
    is the part of the steps in no op (Python, the autograd engine's bookkeeping)."""
    nodes, device, launches = [], [], {}
    ext_ops = {}
    for e in events:
        if e.get("ph") != "X" or "ts" not in e:
            continue
        cat = (e.get("cat") or "").lower()
        ts = float(e["ts"])
        end = ts + float(e.get("dur") or 0)
        name = str(e.get("name", ""))
        if cat in DEVICE_CATS:
            device.append((ts, end, name, _arg(e, "correlation"), _arg(e, "External id")))
            continue
        if cat not in HOST_CATS and cat not in LAUNCH_CATS:
            continue       # kineto's 'Trace' span, overhead records, python functions
        n = _Node(name, ts, end, cat, name.startswith(step_marker))
        nodes.append(((e.get("pid"), e.get("tid")), n))
        if cat in LAUNCH_CATS:
            corr = _arg(e, "correlation")
            if corr is not None:
                launches[corr] = n
        else:
            ext = _arg(e, "External id")
            if ext is not None:
                ext_ops[ext] = n
    _nest(nodes)
    markers = [n for _, n in nodes if n.marker]
    units = []        # (start, end, name, chain of op nodes innermost first, weight in microseconds)
    unlinked = 0.0
    if device:
        kind = "cuda"
        for ts, end, name, corr, ext in device:
            # kineto links a kernel to the innermost op around its launch ('External id':
            # that op's own); without that link, the launch ('correlation') and the ops
            # around it on its thread
            launch = launches.get(corr) if corr is not None else None
            if ext is not None and ext in ext_ops:
                chain = _chain(ext_ops[ext])
            elif launch is not None and launch.parent is not None:
                chain = _chain(launch.parent)
            else:
                chain = []
                unlinked += end - ts
            units.append((ts, end, name, chain, end - ts))
        t0 = min(u[0] for u in units)
        t1 = max(u[1] for u in units)
        busy = _union([(u[0], u[1]) for u in units])
    else:
        kind = "cpu"
        for _, n in nodes:
            if n.marker or n.cat in LAUNCH_CATS:
                continue
            self_us = max(0.0, (n.end - n.ts) - n.children_dur)
            units.append((n.ts, n.end, n.name, _chain(n), self_us))
        if markers:
            t0, t1 = min(m.ts for m in markers), max(m.end for m in markers)
        elif units:
            t0, t1 = min(u[0] for u in units), max(u[1] for u in units)
        else:
            t0 = t1 = 0.0
        top = [(max(n.ts, t0), min(n.end, t1)) for _, n in nodes
               if not n.marker and n.cat not in LAUNCH_CATS and (n.parent is None or n.parent.marker)
               and n.end > t0 and n.ts < t1]
        busy = _union(top)
    return _summarize(kind, units, steps, t0, t1, busy, unlinked, len(markers))


def _summarize(kind, units, steps, t0, t1, busy, unlinked, n_markers):
    steps = max(1, steps)
    per = 1e-3 / steps          # microseconds in the trace -> milliseconds per step
    classes = dict((k, 0.0) for k in CLASS_KEYS if k != "idle")
    rules = {}
    kernels = {}
    conv_groups = {}            # convolution backward op (node id) -> [unit index]
    assigned = [None] * len(units)
    cache = {}                  # the same kernel under the same ops: thousands of times a step
    for i, (ts, end, name, chain, w) in enumerate(units):
        names = [n.name for n in chain]
        if kind == "cpu" and name.startswith(_ENGINE):
            # A CPU unit that is the autograd engine's wrapper of a node: its self time is
            # the node's. Only there: a kernel *inside* the wrapper of ConvolutionBackward0 is
            # not necessarily the node's (the engine sums the gradients the node returns into
            # its inputs' buffers there, an aten::add), so wrappers around a unit never count.
            name = name[len(_ENGINE):]
            names[0] = name
        key = (name, tuple(names))
        if key not in cache:
            cache[key] = classify(name, key[1])
        cls, rule = cache[key]
        assigned[i] = [cls, rule, ""]
        if cls == "conv_bwd":
            # one group per call: the innermost convolution backward op the kernel ran in
            op = next((n for n in chain if _CONV_BWD_RE.search(n.name)), None)
            conv_groups.setdefault(id(op), []).append(i)
    how_total = {"name": 0.0, "position": 0.0, "none": 0.0}
    for idx in conv_groups.values():
        idx.sort(key=lambda i: units[i][0])
        labels = ["d" if _DGRAD_RE.search(units[i][2]) else "w" if _WGRAD_RE.search(units[i][2]) else "?"
                  for i in idx]
        for i, (cls, how) in zip(idx, split_conv_backward(labels)):
            assigned[i][0] = cls
            assigned[i][2] = how
            how_total[how] += units[i][4] * per
    for i, (ts, end, name, chain, w) in enumerate(units):
        cls, rule, how = assigned[i]
        classes[cls] += w * per
        rules[rule] = rules.get(rule, 0.0) + w * per
        k = kernels.setdefault((name, cls), {"name": name if len(name) <= 400 else name[:397] + "...",
                                             "class": cls, "ms": 0.0, "calls": 0,
                                             "rule": rule, "op": chain[0].name if chain else None})
        k["ms"] += w * per
        k["calls"] += 1
    total = sum(u[4] for u in units)
    window = max(0.0, t1 - t0)
    classes["idle"] = max(0.0, window - busy) * per
    out = {
        "unit": "CUDA kernels, copies and memsets" if kind == "cuda" else "CPU ops (self time)",
        "kind": kind,
        "steps": steps,
        "step_markers": n_markers,
        "step_ms": window * per,
        "busy_ms": busy * per,
        "classes": classes,
        # kernels on concurrent streams count in each class: the sum of the classes exceeds
        # the step by this much
        "overlap_ms": max(0.0, total - busy) * per if kind == "cuda" else 0.0,
        "unlinked_ms": unlinked * per,
        "conv_backward_attribution_ms": how_total,
        "rules_ms": dict((str(r), v) for r, v in sorted(rules.items())),
        "kernels": sorted(({**k, "ms": round(k["ms"], 5), "calls": k["calls"] / steps}
                           for k in kernels.values()), key=lambda k: -k["ms"]),
    }
    return out


# --------------------------------------------------------------------------
# gpipe-onnx: layers by ONNX op type
# --------------------------------------------------------------------------
_ONNX = {
    "conv": ("Conv", "ConvTranspose"),
    "gemm": ("MatMul", "Gemm"),
    "norm": ("BatchNormalization", "LayerNormalization", "InstanceNormalization", "GroupNormalization"),
    "softmax": ("Softmax", "LogSoftmax"),
    "elementwise": ("Relu", "LeakyRelu", "Elu", "Gelu", "Erf", "Sigmoid", "HardSigmoid", "Tanh", "Softplus",
                    "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Exp", "Log", "Pow", "Sqrt", "Reciprocal", "Sign",
                    "Floor", "Ceil", "Round", "Clip", "Where", "Dropout", "Sum", "Mean", "Max", "Min", "Mod",
                    "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Not", "And", "Or", "Xor",
                    "Trilu"),
    "reduction": ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare",
                  "ArgMax", "ArgMin"),
    "pooling": ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Resize", "Upsample"),
    "embedding": ("Gather",),
    "copies": ("Concat", "Split", "Slice", "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand",
               "Tile", "Pad", "Cast", "CastLike", "Identity"),
}
ONNX_CLASS = dict((op, cls) for cls, ops in _ONNX.items() for op in ops)
# Layers that are the loss, folded into the exported model (export.py): the U-Net's
# BCE-with-logits against ones is softplus(-logits), Neg and Softplus its only such ops.
FOLDED_LOSS_OPS = {"unet": ("Neg", "Softplus")}


def onnx_class(op, direction, model=None):
    """The class of a gpipe-onnx layer of ONNX type `op`, its 'forward' or 'backward'. A
    Conv's backward is 'conv_bwd': the profile times a layer's backward as one, the data
    and the weight gradient together."""
    if op in FOLDED_LOSS_OPS.get(model, ()):
        return "loss"
    cls = ONNX_CLASS.get(op, "other")
    if cls == "conv":
        return "conv_fwd" if direction == "forward" else "conv_bwd"
    return cls


def gpipe_classes(profile, model=None, chunks=1):
    """Milliseconds per step and class of a `gpipe-onnx balance --profile-out` profile:
    every layer's forward and backward (medians of the repeats, at the micro-batch
    size) times `chunks` micro-batches a step. Also per ONNX op type."""
    classes, ops = {}, {}
    total = 0.0
    for layer in profile["layers"]:
        op = layer["op"]
        o = ops.setdefault(op, {"layers": 0, "forward_ms": 0.0, "backward_ms": 0.0,
                                "forward_class": onnx_class(op, "forward", model),
                                "backward_class": onnx_class(op, "backward", model)})
        o["layers"] += 1
        for direction in ("forward", "backward"):
            ms = float(layer[direction + "_ms"]) * chunks
            cls = onnx_class(op, direction, model)
            c = classes.setdefault(cls, {"forward_ms": 0.0, "backward_ms": 0.0, "ms": 0.0})
            c[direction + "_ms"] += ms
            c["ms"] += ms
            o[direction + "_ms"] += ms
            total += ms
    return {"classes": classes, "ops": ops, "layers_ms": total, "layers": len(profile["layers"])}


# --------------------------------------------------------------------------
# Self-check
# --------------------------------------------------------------------------
def _check():
    cases = [
        # (kernel name, launching ops innermost first, expected class)
        ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64",
         ["aten::cudnn_convolution", "aten::_convolution", "aten::convolution", "aten::conv2d"], "conv_fwd"),
        ("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true>(...)",
         ["aten::cudnn_convolution", "aten::convolution"], "copies"),
        ("sm80_xmma_dgrad_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw",
         ["aten::convolution_backward", "ConvolutionBackward0"], "conv_bwd"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, ...>",
         ["aten::add_", "Optimizer.step#SGD.step"], "optimizer"),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>",
         ["aten::_foreach_add_", "Optimizer.step#SGD.step"], "optimizer"),
        ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(...)>",
         ["aten::copy_", "aten::_to_copy", "aten::to", "aten::linear"], "copies"),
        ("void cunn_SoftMaxForward<4, float, float, float, at::native::LogSoftMaxForwardEpilogue>",
         ["aten::_log_softmax", "aten::log_softmax", "aten::cross_entropy_loss"], "loss"),
        ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>",
         ["aten::_softmax", "aten::softmax"], "softmax"),
        ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", ["aten::mm", "MmBackward0"], "gemm"),
        ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT", ["aten::addmm", "aten::linear"], "gemm"),
        ("void at::native::batch_norm_collect_statistics_kernel<...>",
         ["aten::native_batch_norm", "aten::batch_norm", "aten::instance_norm"], "norm"),
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>",
         ["aten::native_layer_norm", "aten::layer_norm"], "norm"),
        ("void at::native::(anonymous namespace)::max_pool_forward_nchw<float>",
         ["aten::max_pool2d_with_indices", "aten::max_pool2d"], "pooling"),
        ("void at::native::reduce_kernel<512, 1, ...MeanOps...>", ["aten::mean", "aten::adaptive_avg_pool2d"],
         "pooling"),
        ("void at::native::(anonymous namespace)::indexing_backward_kernel<float, 4>",
         ["aten::embedding_dense_backward", "EmbeddingBackward0"], "embedding"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::where_kernel_impl>",
         ["aten::where", "aten::masked_fill"], "elementwise"),
        ("void at::native::(anonymous namespace)::fused_dropout_kernel_vec<float, float, unsigned int, 1, 4>",
         ["aten::native_dropout", "aten::dropout"], "elementwise"),
        ("void pytorch_flash::flash_fwd_kernel<...>", ["aten::_flash_attention_forward",
                                                       "aten::_scaled_dot_product_flash_attention"], "attention"),
        ("Memcpy HtoD (Pageable -> Device)", [], "copies"),
        ("Memset (Device)", ["aten::zero_"], "copies"),
        ("triton_poi_fused_add_relu_threshold_backward_3", [], "elementwise"),
        ("triton_red_fused__native_batch_norm_legit_functional_relu_5", [], "norm"),
        ("triton_per_fused__log_softmax_nll_loss_forward_2", [], "loss"),
        ("triton_poi_fused__to_copy_0", [], "copies"),
        ("triton_red_fused_sum_4", [], "reduction"),
        ("sm90_xmma_wgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", [], "conv_wgrad"),
        ("void cudnn::cnn::wgrad_alg0_engine<float, 128, 5, 5, 3, 3, 3, false, 512>", [], "conv_wgrad"),
        ("some_unknown_kernel", [], "other"),
        ("void at::native::_scatter_gather_elementwise_kernel<128, 4, ...>", [], "elementwise"),
        ("some_broadcast_kernel", [], "other"),      # not a cast
        ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<...>", [], "copies"),
        # CPU units: an op's self time, the op itself first in the chain
        ("aten::mkldnn_convolution", ["aten::mkldnn_convolution", "aten::_convolution", "aten::conv2d"], "conv_fwd"),
        ("aten::convolution_backward", ["aten::convolution_backward", "ConvolutionBackward0"], "conv_bwd"),
        ("aten::relu", ["aten::relu"], "elementwise"),
        ("Optimizer.step#SGD.step", ["Optimizer.step#SGD.step"], "optimizer"),
        # the engine's gradient sum inside a node's wrapper is the sum's, not the node's
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, ...>",
         ["aten::add", "autograd::engine::evaluate_function: ConvolutionBackward0"], "elementwise"),
    ]
    bad = 0
    for name, ops, want in cases:
        got, rule = classify(name, ops)
        if got != want:
            bad += 1
            print("FAIL %s in %s: %s (rule %d), wanted %s" % (name[:60], ops[:2], got, rule, want))
    pos = split_conv_backward(list("?d?w?"))
    want = [("conv_dgrad", "position"), ("conv_dgrad", "name"), ("conv_bwd_unattributed", "none"),
            ("conv_wgrad", "name"), ("conv_wgrad", "position")]
    if pos != want:
        bad += 1
        print("FAIL split_conv_backward: %s" % pos)
    if split_conv_backward(list("?w")) != [("conv_bwd_unattributed", "none"), ("conv_wgrad", "name")]:
        bad += 1
        print("FAIL split_conv_backward ?w")

    # A kineto-style CUDA trace: one step (marker on the main thread), a convolution forward
    # with a layout conversion, a backward on the autograd thread (dgrad, an unnamed kernel,
    # wgrad; then a second convolution's backward: wgrad and an unnamed kernel after it, the
    # second launched through the driver API as Triton's are), a layer norm kernel linked by
    # its op's External id alone, SGD; 5 us of the 100 us step idle.
    def op(name, ts, dur, tid, cat="cpu_op", **args):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}

    def kern(name, ts, dur, corr, cat="kernel", ext=999):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7,
                "args": {"correlation": corr, "External id": ext}}
    ev = [
        op("bench step 0", 0, 200, 1, cat="user_annotation"),
        op("aten::conv2d", 1, 10, 1), op("aten::convolution", 1, 9, 1), op("aten::cudnn_convolution", 2, 8, 1),
        op("cudaLaunchKernel", 3, 1, 1, cat="cuda_runtime", correlation=1),
        op("cudaLaunchKernel", 5, 1, 1, cat="cuda_runtime", correlation=2),
        op("aten::native_layer_norm", 12, 3, 1, **{"External id": 77}),
        op("ConvolutionBackward0", 20, 30, 2), op("aten::convolution_backward", 21, 28, 2),
        op("cudaLaunchKernel", 22, 1, 2, cat="cuda_runtime", correlation=3),
        op("cudaLaunchKernel", 24, 1, 2, cat="cuda_runtime", correlation=4),
        op("cudaLaunchKernel", 26, 1, 2, cat="cuda_runtime", correlation=5),
        op("ConvolutionBackward0", 60, 30, 2), op("aten::convolution_backward", 61, 28, 2),
        op("cudaLaunchKernel", 62, 1, 2, cat="cuda_runtime", correlation=6),
        op("cuLaunchKernel", 64, 1, 2, cat="cuda_driver", correlation=7),
        op("Optimizer.step#SGD.step", 100, 50, 1, cat="user_annotation"),
        op("aten::_foreach_add_", 101, 40, 1),
        op("cudaLaunchKernel", 102, 1, 1, cat="cuda_runtime", correlation=8),
        op("cudaMemsetAsync", 103, 1, 1, cat="cuda_runtime", correlation=9),
        kern("nchwToNhwcKernel", 1000, 5, 1), kern("sm80_xmma_fprop_implicit_gemm", 1005, 20, 2),
        kern("vectorized_layer_norm_kernel", 1025, 5, 50, ext=77),   # linked by its op's External id only
        kern("sm80_xmma_dgrad_implicit_gemm", 1030, 10, 3), kern("scalePackedTensor_kernel", 1040, 5, 4),
        kern("sm80_xmma_wgrad_implicit_gemm", 1045, 15, 5),
        kern("sm80_xmma_wgrad_implicit_gemm", 1060, 15, 6), kern("computeOffsetsKernel", 1075, 5, 7),
        kern("multi_tensor_apply_kernel", 1085, 10, 8), kern("Memset (Device)", 1095, 5, 9, cat="gpu_memset"),
        kern("orphan_kernel_without_launch", 1050, 5, 42),     # overlaps: counted, not in the union twice
    ]
    r = analyze_trace(ev, 1, "bench step")
    want = {"copies": 0.010, "conv_fwd": 0.020, "conv_dgrad": 0.010, "conv_wgrad": 0.035,
            "conv_bwd_unattributed": 0.005, "optimizer": 0.010, "other": 0.005, "norm": 0.005,
            "idle": 0.005}
    for k, v in want.items():
        if abs(r["classes"][k] - v) > 1e-9:
            bad += 1
            print("FAIL trace: %s %.4f ms, wanted %.4f" % (k, r["classes"][k], v))
    if abs(r["step_ms"] - 0.100) > 1e-9 or abs(r["overlap_ms"] - 0.005) > 1e-9:
        bad += 1
        print("FAIL trace: step %.4f ms, overlap %.4f ms" % (r["step_ms"], r["overlap_ms"]))
    # scalePackedTensor sits between dgrad and wgrad: no position tells; computeOffsets
    # follows a wgrad kernel: the weight gradient's
    a = r["conv_backward_attribution_ms"]
    if abs(a["position"] - 0.005) > 1e-9 or abs(a["none"] - 0.005) > 1e-9 or abs(a["name"] - 0.040) > 1e-9:
        bad += 1
        print("FAIL trace: attribution %s" % r["conv_backward_attribution_ms"])

    # A legacy (categoryless) CPU trace: 2 steps of 100 us, ops self times, idle between ops.
    cpu = []
    for s in range(2):
        b = s * 100
        cpu += [{"ph": "X", "name": "bench step %d" % s, "ts": b, "dur": 100, "tid": 1, "pid": "CPU functions"},
                {"ph": "X", "name": "aten::conv2d", "ts": b + 10, "dur": 40, "tid": 1, "pid": "CPU functions"},
                {"ph": "X", "name": "aten::mkldnn_convolution", "ts": b + 15, "dur": 30, "tid": 1,
                 "pid": "CPU functions"},
                {"ph": "X", "name": "aten::relu", "ts": b + 60, "dur": 20, "tid": 1, "pid": "CPU functions"},
                {"ph": "X", "name": _ENGINE + "ConvolutionBackward0", "ts": b + 85, "dur": 10, "tid": 1,
                 "pid": "CPU functions"}]
    r = analyze_trace(cpu, 2, "bench step")
    want = {"conv_fwd": 0.040, "elementwise": 0.020, "conv_bwd_unattributed": 0.010, "idle": 0.030}
    for k, v in want.items():
        if abs(r["classes"][k] - v) > 1e-9:
            bad += 1
            print("FAIL cpu trace: %s %.4f ms, wanted %.4f" % (k, r["classes"][k], v))

    prof = {"layers": [{"op": "Conv", "forward_ms": 1.0, "backward_ms": 2.0},
                       {"op": "Relu", "forward_ms": 0.1, "backward_ms": 0.2},
                       {"op": "Softplus", "forward_ms": 0.3, "backward_ms": 0.4}]}
    g = gpipe_classes(prof, "unet", chunks=2)
    if (abs(g["classes"]["conv_bwd"]["ms"] - 4.0) > 1e-9 or abs(g["classes"]["loss"]["ms"] - 1.4) > 1e-9
            or abs(g["layers_ms"] - 8.0) > 1e-9):
        bad += 1
        print("FAIL gpipe_classes: %s" % g)
    print("op_classes: %d case%s failed" % (bad, "" if bad == 1 else "s") if bad else "op_classes: all checks pass")
    return bad == 0


if __name__ == "__main__":
    sys.exit(0 if _check() else 1)
