"""The memory layout of a work-queue ring: the one source of its constants.

``kernels/svmkit_workqueue.h`` declares the same layout for kernels (``svmkit_wq`` and the
``SVMKIT_WQ_*`` macros; tests/test_workqueue.py parses the header and compares), ``setup.py``
passes these values to the C ring (``svmkit.workqueue._cring``) as ``-D`` macros, and the C
ring exports what it was built with as ``LAYOUT``, which :mod:`svmkit.workqueue.ring`
compares with :func:`as_dict` before it uses the C ring.

Byte offsets::

      0  head    uint64   consumers' claim counter                   (own 64-byte line)
     64  tail    uint64   producers' claim counter, bit 63 = closed  (own line)
    128  closed  uint32   mirror of tail's bit 63 for idle readers   (own line)
    192  mask uint64, capacity uint64, item_size uint32, magic uint32,
         slot_bytes uint32                                         (set once by the host)
    256  slots[capacity] of slot_bytes each: seq uint64 at +0, item at +8

An item is a number of up to 8 bytes or a record of up to ``MAX_ITEM_BYTES``; a slot is
``slot_bytes(item_size)`` long (16 for items of up to 8 bytes, 72 for 64-byte records).
The host writes that stride into the header when it creates the ring, and the C ring, the
pure-Python ring and the device (``svmkit_wq_seq``/``svmkit_wq_item`` in the header) all
read it from there, so they agree at run time whatever item type each was built for.

Keeping head, tail and the closed mirror on separate cache lines keeps producers and
consumers from invalidating each other's line on every claim (fine-grain SVM with atomics,
OpenCL 3.0 section 5.6.2: the host and devices update these words concurrently).

This module imports nothing, so ``setup.py`` can read it before svmkit is installed.
"""

from __future__ import annotations

__all__ = [
    "CLOSED_BIT",
    "CLOSED_OFFSET",
    "HEADER_BYTES",
    "HEAD_OFFSET",
    "ITEM_OFFSET",
    "MAGIC",
    "ITEM_SIZE_OFFSET",
    "MAGIC_OFFSET",
    "MAX_ITEM_BYTES",
    "PARAMS_OFFSET",
    "SLOT_BYTES_OFFSET",
    "TAIL_OFFSET",
    "as_dict",
    "c_macros",
    "slot_bytes",
]

HEAD_OFFSET = 0
TAIL_OFFSET = 64
CLOSED_OFFSET = 128
PARAMS_OFFSET = 192  # mask, capacity (uint64), item_size, magic, slot_bytes (uint32)
ITEM_SIZE_OFFSET = 208
MAGIC_OFFSET = 212
SLOT_BYTES_OFFSET = 216
HEADER_BYTES = 256
ITEM_OFFSET = 8  # within a slot; seq is at +0
MAX_ITEM_BYTES = 64
MAGIC = 0x53564D51  # "SVMQ"
CLOSED_BIT = 1 << 63


def as_dict() -> dict[str, int]:
    """Every layout constant by name (what the C ring's ``LAYOUT`` must equal)."""
    return {
        "HEAD_OFFSET": HEAD_OFFSET,
        "TAIL_OFFSET": TAIL_OFFSET,
        "CLOSED_OFFSET": CLOSED_OFFSET,
        "PARAMS_OFFSET": PARAMS_OFFSET,
        "ITEM_SIZE_OFFSET": ITEM_SIZE_OFFSET,
        "MAGIC_OFFSET": MAGIC_OFFSET,
        "SLOT_BYTES_OFFSET": SLOT_BYTES_OFFSET,
        "HEADER_BYTES": HEADER_BYTES,
        "ITEM_OFFSET": ITEM_OFFSET,
        "MAX_ITEM_BYTES": MAX_ITEM_BYTES,
        "MAGIC": MAGIC,
        "CLOSED_BIT": CLOSED_BIT,
    }


def slot_bytes(itemsize: int) -> int:
    """The slot stride for items of ``itemsize`` bytes: the seq word, then the item rounded
    up to 8 bytes (so every slot's seq stays 8-byte aligned for its atomics)."""
    return ITEM_OFFSET + (itemsize + 7) // 8 * 8


def c_macros() -> list[tuple[str, str]]:
    """``(name, value)`` pairs ``setup.py`` defines when it compiles the C ring."""
    return [(f"SVMKIT_WQ_{name}", f"UINT64_C({value:#x})") for name, value in as_dict().items()]
