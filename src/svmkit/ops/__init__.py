"""Operations on SVM: fill, copy, migrate and launch, each checked before the driver sees it."""

from svmkit.ops.kernel_launch import launch
from svmkit.ops.transfer import copy, fill, migrate

__all__ = ["copy", "fill", "launch", "migrate"]
