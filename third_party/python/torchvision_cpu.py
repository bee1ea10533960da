"""Lets PyPI's torchvision (a CUDA build) import beside a CPU build of torch.

Installed into the CPU environment's site-packages with a `.pth` line that imports it at interpreter start, so every
process of the environment has it (vLLM inspects a model in a subprocess of its own). It only registers an import
hook: nothing is imported until `torchvision` is.

torchvision's `_C` extension links libtorch_cuda, so beside a CPU torch it does not load, and torchvision's import then
stops in `_meta_registrations` on `operator torchvision::nms does not exist`. Before that import, this declares the
schemas of torchvision 0.28's operators (without kernels): `import torchvision` then works, its transforms run (they
are torch code), and its detection operators (nms, roi_align, deform_conv2d, ...) refuse to run with torch's "could
not run ... with arguments from the 'CPU' backend". On a CUDA build of torch nothing is declared.
"""

from __future__ import annotations

import importlib.abc
import sys

SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "SymInt batch_size, SymInt channels, SymInt height, SymInt width, int sampling_ratio, bool aligned) -> Tensor",
    "qroi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio) -> (Tensor, Tensor)",
    "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, int sampling_ratio, SymInt batch_size, SymInt channels, "
    "SymInt height, SymInt width) -> Tensor",
    "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) "
    "-> Tensor",
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, "
    "SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, "
    "SymInt offset_groups, bool use_mask) -> Tensor",
    "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
    "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, "
    "SymInt groups, SymInt offset_groups, bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
)
_library = None  # kept alive: the declarations live as long as their Library object


def declare_operators() -> None:
    """Declares torchvision's operators on a CPU build of torch where nothing has declared them yet."""
    global _library
    import torch

    if torch.version.cuda is not None or _library is not None:
        return
    try:
        torch.ops.torchvision.nms  # noqa: B018  (declared already: torchvision's own extension loaded)
        return
    except (AttributeError, RuntimeError):
        pass
    _library = torch.library.Library("torchvision", "DEF")
    for schema in SCHEMAS:
        _library.define(schema)


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision":
            sys.meta_path.remove(self)
            declare_operators()
        return None  # the ordinary finders import it


sys.meta_path.insert(0, _BeforeTorchvision())
