# find_package(torchops): the imported target torchops::torchops, which brings the public header
# (<torchops/ops.h>), libtorchops.so (every myns op; linked even though nothing calls into it directly, so its
# static registrations run) and libtorch. Also sets TORCHOPS_INCLUDE_DIRS and TORCHOPS_LIBRARY.
#
# Found through torchops.cmake_prefix_path; `python -m torchops.cmake_args` prints a whole configure line
# (torch's and torchops' prefixes, plus the CUDA settings find_package(Torch) needs on a pip-installed torch).

# This file lives in <package>/share/cmake/torchops; the header in <package>/include, the library in <package>/lib.
get_filename_component(_torchops_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
set(TORCHOPS_INCLUDE_DIRS "${_torchops_prefix}/include")
set(TORCHOPS_LIBRARY "${_torchops_prefix}/lib/libtorchops.so")
unset(_torchops_prefix)

if(NOT EXISTS "${TORCHOPS_LIBRARY}")
  set(torchops_FOUND FALSE)
  set(torchops_NOT_FOUND_MESSAGE
      "${TORCHOPS_LIBRARY} does not exist: build torchops first (`make build`, or `pip install .`)")
  return()
endif()

# The header and the library need libtorch; a project that found Torch already keeps its own.
include(CMakeFindDependencyMacro)
if(NOT TARGET torch)
  find_dependency(Torch)
endif()

if(NOT TARGET torchops::torchops)
  get_filename_component(_torchops_libdir "${TORCHOPS_LIBRARY}" DIRECTORY)
  add_library(torchops::torchops INTERFACE IMPORTED)
  set_target_properties(torchops::torchops PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${TORCHOPS_INCLUDE_DIRS}"
    # --no-as-needed, the way torch links its own registration libraries (Caffe2Targets.cmake): linkers
    # that default to --as-needed would otherwise drop a library no symbol is taken from.
    INTERFACE_LINK_LIBRARIES "-Wl,--no-as-needed,\"${TORCHOPS_LIBRARY}\" -Wl,--as-needed;torch"
    # A flag is not a library to CMake, so it adds no rpath for it: say where the library lives.
    INTERFACE_LINK_OPTIONS "LINKER:-rpath,${_torchops_libdir}"
    # PyTorch's headers need C++20 (2.14; 17 before): a property of torch's target that doesn't propagate.
    INTERFACE_COMPILE_FEATURES cxx_std_20)
  unset(_torchops_libdir)
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(torchops REQUIRED_VARS TORCHOPS_LIBRARY TORCHOPS_INCLUDE_DIRS)
