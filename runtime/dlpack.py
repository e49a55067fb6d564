"""DLPack capsules (dlpack.h, the unversioned "dltensor" kind) made and read through ctypes,
for device memory NumPy cannot hold: `export` lends an array's memory to a consumer until it
calls the deleter; `Imported` takes a producer's capsule and calls its deleter when it goes."""
from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from ir.ops.base import dtype_name, np_dtype


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


NAME, USED = b"dltensor", b"used_dltensor"     # (module constants: a capsule keeps the pointer)
_CODES = {0: "i", 1: "u", 2: "f"}              # kDLInt, kDLUInt, kDLFloat; kDLBool is 6
BFLOAT = 4                                     # kDLBfloat: ml_dtypes.bfloat16's bits
_NAMES = {3: "opaque handle", 4: "bfloat", 5: "complex", 6: "bool"}


def _api(name: str, restype, *argtypes):
    """A private prototype of a CPython API function (ctypes.pythonapi's are shared)."""
    fn = ctypes.pythonapi[name]
    fn.restype, fn.argtypes = restype, argtypes
    return fn


_get_pointer = _api("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)
_set_name = _api("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
_is_valid = _api("PyCapsule_IsValid", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
_pointer_of = _api("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)
_new = _api("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)


def row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides, in items, of a C-contiguous array of this shape."""
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))


# ---------------------------------------------------------------- export

_lent: dict[int, tuple] = {}       # a lent DLManagedTensor's address -> it, and what it lends


@_Deleter
def _return(address: int) -> None:
    _lent.pop(address, None)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _collect(capsule: int) -> None:
    """A capsule's destructor: one never consumed still holds its tensor, which goes back."""
    if _is_valid(capsule, NAME):
        _return(_pointer_of(capsule, NAME))


def export(ptr: int, shape: tuple[int, ...], dtype: np.dtype, device: tuple[int, int],
           owner: Any) -> Any:
    """A "dltensor" capsule of the C-contiguous array at ptr; `owner` stays alive until the
    consumer calls the deleter (or the capsule is dropped unconsumed)."""
    dtype = np.dtype(dtype)
    code = (6 if dtype.kind == "b" else BFLOAT if dtype_name(dtype) == "bf16"
            else {v: k for k, v in _CODES.items()}[dtype.kind])
    sizes = (ctypes.c_int64 * len(shape))(*shape)
    strides = (ctypes.c_int64 * len(shape))(*row_major(shape))
    managed = _Managed(_Tensor(ptr, _Device(*device), len(shape), _DataType(code, dtype.itemsize * 8, 1),
                               sizes, strides, 0), None, _return)
    address = ctypes.addressof(managed)
    _lent[address] = (managed, sizes, strides, owner)
    return _new(address, NAME, ctypes.cast(_collect, ctypes.c_void_p))


# ---------------------------------------------------------------- consume


class Imported:
    """A consumed capsule's tensor: where it lies and what it holds (dtype: a NumPy dtype, or
    the name of one NumPy lacks). Its producer's deleter runs when this object goes."""

    def __init__(self, capsule: Any):
        address = _get_pointer(capsule, NAME)
        _set_name(capsule, USED)                      # its tensor is ours to give back now
        managed = _Managed.from_address(address)
        t = managed.dl_tensor
        self.device = (t.device.device_type, t.device.device_id)
        self.ptr = (t.data or 0) + t.byte_offset
        self.shape = tuple(t.shape[i] for i in range(t.ndim))
        self.strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else None  # in items
        self.dtype = _dtype(t.dtype)
        self._address, self._deleter = address, managed.deleter

    def __del__(self):
        if self._deleter:                             # (a NULL deleter: nothing to give back)
            self._deleter(self._address)


def _dtype(t: _DataType) -> np.dtype | str:
    if t.lanes == 1 and t.code == 6 and t.bits == 8:
        return np.dtype(bool)
    if t.lanes == 1 and t.code == BFLOAT and t.bits == 16:
        return np_dtype("bf16")
    if t.lanes == 1 and t.code in _CODES and t.bits in (8, 16, 32, 64):
        return np.dtype(f"{_CODES[t.code]}{t.bits // 8}")
    return f"{_NAMES.get(t.code, f'type code {t.code}')}{t.bits}" + (f"x{t.lanes}" if t.lanes != 1 else "")
