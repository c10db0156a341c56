"""Operations on SVM: fill, copy, migrate, launch and tracked kernels, each checked before
the driver sees it; record names work svmkit did not enqueue."""

from svmkit.ops.kernel_launch import launch
from svmkit.ops.kernels import Kernel, Program
from svmkit.ops.record import record
from svmkit.ops.transfer import copy, fill, migrate

__all__ = ["Kernel", "Program", "copy", "fill", "launch", "migrate", "record"]
