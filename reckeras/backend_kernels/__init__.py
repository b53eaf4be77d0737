"""The kernels under the embedding engine and the feature transforms.

Each module is one kernel family: a torch reference that defines the
semantics, a Triton kernel for CUDA tensors and, for the hot CPU paths,
a native C loop (`cpu_native`). `dispatch` decides which one runs.
Nothing here imports reckeras but `reckeras.ragged`.
"""
