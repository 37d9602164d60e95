# Defines the target cutrain::cuda (cutrain + CUDA runtime, cuBLASLt, NVRTC, the driver API, cuDNN
# and the cudnn-frontend headers, and CUTRAIN_WITH_CUDA) when all of them are found. Used by the
# build tree and by the installed package config alike.
#
# cutrain::cuda is a static library of one translation unit, cutrain_cuda_impl.cpp beside this
# file: the CUDA backend's implementation unit (cutrain/cuda/impl.hpp, the bodies that need
# cudnn-frontend), compiled once per build with the consumer's compiler and flags. It is built
# only when a target links it.
#
# cudnn-frontend is header-only. Its headers come from CUTRAIN_CUDNN_FRONTEND_INCLUDE_DIR, or
# from the PyPI wheel nvidia-cudnn-frontend (include/ under the python package), or from the
# CUDA include directory.
function(cutrain_define_cuda_target base)
  if(TARGET cutrain::cuda)
    return()
  endif()
  find_package(CUDAToolkit QUIET)
  if(NOT CUDAToolkit_FOUND)
    message(STATUS "cutrain: CUDA toolkit not found; cutrain::cuda is not defined")
    return()
  endif()
  find_path(CUTRAIN_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include /usr/include/x86_64-linux-gnu)
  find_library(CUTRAIN_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu)
  if(NOT CUTRAIN_CUDNN_FRONTEND_INCLUDE_DIR)
    find_package(Python3 COMPONENTS Interpreter QUIET)
    if(Python3_Interpreter_FOUND)
      execute_process(
        COMMAND "${Python3_EXECUTABLE}" -c
          "import importlib.util,os;s=importlib.util.find_spec('cudnn');print(os.path.join(os.path.dirname(os.path.dirname(s.origin)),'include') if s and s.origin else '')"
        OUTPUT_VARIABLE _fe_hint OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    endif()
    find_path(CUTRAIN_CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h HINTS ${_fe_hint} ${CUDAToolkit_INCLUDE_DIRS})
  endif()
  if(NOT CUTRAIN_CUDNN_INCLUDE_DIR OR NOT CUTRAIN_CUDNN_LIBRARY OR NOT CUTRAIN_CUDNN_FRONTEND_INCLUDE_DIR)
    message(STATUS "cutrain: cuDNN (${CUTRAIN_CUDNN_LIBRARY}) or cudnn-frontend (${CUTRAIN_CUDNN_FRONTEND_INCLUDE_DIR}) "
                   "not found; cutrain::cuda is not defined")
    return()
  endif()
  add_library(cutrain_cuda STATIC EXCLUDE_FROM_ALL "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/cutrain_cuda_impl.cpp")
  target_link_libraries(cutrain_cuda PUBLIC ${base} CUDA::cudart CUDA::cublasLt CUDA::nvrtc CUDA::cuda_driver
                        ${CUTRAIN_CUDNN_LIBRARY})
  target_include_directories(cutrain_cuda SYSTEM PUBLIC ${CUTRAIN_CUDNN_INCLUDE_DIR} ${CUTRAIN_CUDNN_FRONTEND_INCLUDE_DIR})
  target_compile_definitions(cutrain_cuda PUBLIC CUTRAIN_WITH_CUDA)
  # cudnn-frontend bundles its own nlohmann/json (another version) under the same include guard,
  # so a translation unit compiles whichever copy it includes first, silently. Including the
  # package's copy (the one cutrain::cutrain uses) before anything else makes it the only one in
  # every program, whatever the order of the includes; the frontend's #include is then empty.
  target_compile_options(cutrain_cuda PUBLIC "$<$<COMPILE_LANGUAGE:CXX>:SHELL:-include nlohmann/json.hpp>")
  # cutrain reaches the driver API through the runtime (cudaGetDriverEntryPointByVersion), so a
  # binary must not need libcuda.so.1 to start: on a machine without a driver it then reports
  # that it has no GPU instead of failing to load. --as-needed drops libraries nothing uses.
  target_link_options(cutrain_cuda INTERFACE "LINKER:--as-needed")
  add_library(cutrain::cuda ALIAS cutrain_cuda)
  message(STATUS "cutrain: cutrain::cuda with cuDNN ${CUTRAIN_CUDNN_LIBRARY}, cudnn-frontend ${CUTRAIN_CUDNN_FRONTEND_INCLUDE_DIR}")
endfunction()
