# `cmake --install BUILD --prefix PREFIX`: loom as a C++ library for other projects.
#   PREFIX/include/loom/...           the public headers
#   PREFIX/lib/libloom.a              the library (static)
#   PREFIX/bin/loom                   the command-line tool (when built)
#   PREFIX/lib/cmake/loom/            loomConfig.cmake: find_package(loom CONFIG) gives loom::loom
#   PREFIX/lib/pkgconfig/loom.pc      pkg-config --cflags --libs loom
# A consumer finds loom's own dependencies (fmt, nlohmann_json, oneDNN, OpenMP, MPI where loom
# was built with it, and the CUDA toolkit in CUDA builds) through the same packages loom was built with (Debian's).
include(CMakePackageConfigHelpers)

install(TARGETS loom EXPORT loomTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/loom DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET loom_tool)
  install(TARGETS loom_tool RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(loom_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/loom)
install(EXPORT loomTargets NAMESPACE loom:: DESTINATION ${loom_cmake_dir})
# ONNX import, loom::onnx (include/loom/onnx), in an export set of its own: consumers that have
# ONNX's CMake package (Debian's libonnx-dev) get the target; others find loom without it.
if(TARGET loom_onnx AND TARGET loom_tool)
  set_target_properties(loom_onnx PROPERTIES EXPORT_NAME onnx)
  install(TARGETS loom_onnx EXPORT loomOnnxTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT loomOnnxTargets NAMESPACE loom:: DESTINATION ${loom_cmake_dir})
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/loomConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/loomConfig.cmake
                              INSTALL_DESTINATION ${loom_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/loomConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/loomConfig.cmake ${PROJECT_BINARY_DIR}/loomConfigVersion.cmake
        DESTINATION ${loom_cmake_dir})

# pkg-config: a static library, so Libs carries what libloom.a needs.
set(LOOM_PC_CFLAGS "")
set(LOOM_PC_LIBS "-ldnnl -fopenmp -pthread")
set(LOOM_PC_REQUIRES "fmt")
if(LOOM_HAVE_MPI)
  string(APPEND LOOM_PC_REQUIRES " ompi-c")  # Open MPI's C library (libopenmpi-dev)
endif()
if(LOOM_HAVE_CUDA)
  set(LOOM_PC_CFLAGS "-DLOOM_HAVE_CUDA=1")
  string(APPEND LOOM_PC_LIBS " -L${CUDAToolkit_LIBRARY_DIR} -Wl,-rpath,${CUDAToolkit_LIBRARY_DIR}"
         " -lcudart -ldl")
endif()
# The prefix as seen from the .pc file, so an installed tree can move.
file(RELATIVE_PATH LOOM_PC_PREFIX /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
configure_file(${PROJECT_SOURCE_DIR}/cmake/loom.pc.in ${PROJECT_BINARY_DIR}/loom.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/loom.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
