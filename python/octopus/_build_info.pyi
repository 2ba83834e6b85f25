# The module CMake writes into the installed package (see CMakeLists.txt).
TORCH_VERSION: str
TORCH_CUDA_VERSION: str | None
