"""Keeping a fine-tuning process's resident memory near the model's size (Linux, glibc).

Two effects would otherwise add hundreds of MB to the peak RSS of a memory-bound run (measured on
SmolLM2-135M: docs/design.md, "Resident memory"):

1. A model loaded from safetensors is a private memory map of the file. Pages it has read stay
   resident (counted in RSS) while the map lives, and it lives as long as any weight in it does.
   So when FAR's surgery replaces the FFN weights by split copies, the replaced FFN pages stay
   mapped beside the copies. `to_private_memory` copies chosen weights into ordinary memory one at
   a time and gives their file pages back at once. (The weights left mapped keep a benefit:
   embedding rows that are never read are never resident.)
2. MeZO draws and frees MB-sized temporaries thousands of times per step. glibc raises its mmap
   threshold after such frees and then serves them from its heap, which fragments, so the peak RSS
   differs from run to run. `release_freed_memory` pins the threshold so large blocks are mapped
   and unmapped, i.e. returned to the system when freed.

Both change residency, never values: weights and results are bit-identical with or without them,
and on other platforms they do nothing. Pages are given back in two ways (`page_out`): reclaimed
(MADV_PAGEOUT), which works only for pages no other process maps, then, for file pages another
process also maps (say a second run reading the same checkpoint), unmapped from this process
(MADV_DONTNEED) after /proc/self/pagemap confirms each is an unmodified page of the file, which
the kernel reloads from the file unchanged if it is read again.
"""

from __future__ import annotations

import array
import ctypes
import ctypes.util
import functools
import resource
import sys
from collections.abc import Iterable

from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from far.hardware import peak_rss_bytes

MADV_RANDOM = 1  # no readahead on faults here: a paged-out row comes back alone, not with its neighbours
MADV_DONTNEED = 4  # unmap from this process; for a clean page of a file mapping, a later read reloads it
MADV_PAGEOUT = 21  # Linux >= 5.4: reclaim these pages now; their contents stay valid (reloaded on access)
PRESENT, FILE_PAGE = 1 << 63, 1 << 61  # /proc/self/pagemap flags; a written private page is anonymous
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
PAGE = 4096


@functools.cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def release_freed_memory(mmap_threshold: int = 128 * 1024) -> bool:
    """Give memory freed so far back to the system, and from now on blocks of `mmap_threshold` bytes or more.

    Process-wide and lasting (glibc has no scope for it): call it at the start of a memory-bound
    run, and again after freeing something large (a tokenizer, raw data) to return its pages.
    Costs a page fault per page of each new large block.

    Returns:
        True if glibc took the setting, False where there is no glibc (it then does nothing).
    """
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    # Setting either threshold turns glibc's dynamic adjustment of both off.
    ok = bool(libc.mallopt(M_MMAP_THRESHOLD, int(mmap_threshold))) and bool(libc.mallopt(M_TRIM_THRESHOLD, 0))
    libc.malloc_trim(0)  # free pages inside the heap too, not only at its top
    return ok


def _whole_pages(tensor: Tensor) -> tuple[int, int]:
    """[first, last) page-aligned addresses inside the tensor's bytes (neighbours keep theirs)."""
    if tensor.is_contiguous():  # the tensor's own bytes, not a storage it may share with others
        start, size = tensor.data_ptr(), tensor.numel() * tensor.element_size()
    else:
        start, size = tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes()
    return -(-start // PAGE) * PAGE, (start + size) // PAGE * PAGE


def _madvise(tensor: Tensor, advice: int) -> int:
    libc = _libc()
    if libc is None or tensor.device.type != "cpu":
        return 0
    first, last = _whole_pages(tensor)
    if last <= first:
        return 0
    return last - first if libc.madvise(first, last - first, advice) == 0 else 0


def _clean_file_page_runs(first: int, last: int) -> list[tuple[int, int]]:
    """(start, length) runs of pages in [first, last) that are mapped, unmodified pages of a file."""
    n = (last - first) // PAGE
    try:
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(first // PAGE * 8)
            entries = array.array("Q", f.read(n * 8))
    except OSError:
        return []
    runs, start = [], None
    for i, entry in enumerate([*entries, 0]):  # a sentinel closes the last run
        clean = entry & PRESENT and entry & FILE_PAGE
        if clean and start is None:
            start = i
        elif not clean and start is not None:
            runs.append((first + start * PAGE, (i - start) * PAGE))
            start = None
    return runs


def page_out(tensor: Tensor) -> int:
    """Drop the whole pages inside `tensor`'s memory from this process's RSS where that keeps values.

    Pages only this process maps are reclaimed (MADV_PAGEOUT; contents stay valid, reloaded if read
    again); unmodified file pages that other processes map too are unmapped here (MADV_DONTNEED;
    reloaded unchanged from the file if read again). Safe on any CPU tensor; it only helps for one
    whose pages are not in use, e.g. a frozen memory-mapped weight between two reads.

    Returns:
        Bytes asked to be reclaimed (0 where nothing applies).
    """
    asked = _madvise(tensor, MADV_PAGEOUT)
    libc = _libc()
    if asked and libc is not None:
        for start, length in _clean_file_page_runs(*_whole_pages(tensor)):
            libc.madvise(start, length, MADV_DONTNEED)
    return asked


def to_private_memory(model: nn.Module, names: Iterable[str]) -> int:
    """Move the named parameters out of a memory-mapped checkpoint into ordinary memory, one by one.

    Each is copied, put in place of the original (same Parameter object, so optimizers and ties
    are unaffected), and the original's file pages are paged out before the next copy, so the
    peak grows by one tensor at most. `names` are qualified, e.g. every FFN weight before FAR's surgery.

    Returns:
        Bytes of file pages given back.
    """
    params = [model.get_parameter(name) for name in names]  # all looked up (and checked) first
    released = 0
    for param in params:
        old = param.data
        param.data = old.clone()
        released += page_out(old)
        del old
    return released


def page_out_after_forward(module: nn.Module) -> RemovableHandle:
    """After every forward of `module`, page out its own parameters' memory (`page_out`).

    For a frozen embedding read from a memory-mapped checkpoint: a lookup of a few hundred tokens
    maps in nearly the whole matrix (the kernel maps up to 64 KB around each faulting page), and
    over a run every row gets read. Paging it out after each lookup keeps only the current
    batch's rows resident; they are read back from the file (or the page cache) the next time.
    Values are never affected, so it is safe even if the weights are trained; it only helps while
    they are not written (written pages become private memory, which stays).

    Returns:
        The hook's handle; `handle.remove()` stops it.

    Example:
        >>> handle = page_out_after_forward(model.get_input_embeddings())
    """

    params = [p.detach() for p in module.parameters(recurse=False)]
    for param in params:
        _madvise(param, MADV_RANDOM)

    def hook(mod: nn.Module, args: object, output: object) -> None:
        for param in params:
            page_out(param)

    return module.register_forward_hook(hook)


class PhaseMemory:
    """Resident memory after each phase of a run: current RSS and the process's peak so far (MiB)."""

    def __init__(self) -> None:
        self.phases: list[dict] = []

    def mark(self, phase: str) -> None:
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[1]) * resource.getpagesize()
        peak = peak_rss_bytes()
        self.phases.append({"phase": phase, "rss_mib": round(current / 2**20, 1), "peak_mib": round(peak / 2**20, 1)})
