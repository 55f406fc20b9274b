# The settings and packages of every dgmm build: the repository's top-level
# CMakeLists.txt and a binding built as a project of its own call
# dgmm_core_settings() after project().
macro(dgmm_core_settings)
  set(CMAKE_CXX_STANDARD 20)
  set(CMAKE_CXX_STANDARD_REQUIRED ON)
  set(CMAKE_CXX_EXTENSIONS OFF)
  if(NOT CMAKE_BUILD_TYPE)
    set(CMAKE_BUILD_TYPE Release CACHE STRING "" FORCE)
  endif()
  find_package(Threads REQUIRED)
  find_package(absl CONFIG REQUIRED)
  find_package(Protobuf REQUIRED)
  find_package(gRPC CONFIG REQUIRED)
  find_program(GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
endmacro()

# For a binding built as a project of its own (client/python, client/node:
# `cmake -S <binding>`): after project(), those settings and the core --
# dgmm_proto and dgmm_client -- from `dgmm_core`, a folder holding proto/
# and client/cpp/ (the repository, or a copy packed with the binding).
macro(dgmm_core_project dgmm_core)
  dgmm_core_settings()
  add_library(dgmm_warnings INTERFACE)
  set(PROJECT_SOURCE_DIR ${dgmm_core})
  add_subdirectory(${dgmm_core}/proto proto)
  add_subdirectory(${dgmm_core}/client/cpp client_cpp)
endmacro()
