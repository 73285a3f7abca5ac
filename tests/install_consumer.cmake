# Installs the kwq build tree into a scratch prefix, then configures, builds and runs the
# consumer in tests/consumer against it, and checks the pkg-config file. Run by ctest.
file(REMOVE_RECURSE ${KWQ_WORK_DIR})
set(prefix ${KWQ_WORK_DIR}/prefix)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${KWQ_BINARY_DIR} --prefix ${prefix}
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
endif()
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${KWQ_CONSUMER_SOURCE} -B ${KWQ_WORK_DIR}/build -G Ninja
          -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${KWQ_CXX_COMPILER}
          "-DCMAKE_CXX_FLAGS=${KWQ_CXX_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${KWQ_CXX_FLAGS}"
  RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${KWQ_WORK_DIR}/build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${KWQ_WORK_DIR}/build/consumer RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the consumer failed: ${rc}")
endif()
# kwq::prometheus, when this build has it, must come with the installed package.
if(KWQ_WITH_PROMETHEUS)
  execute_process(COMMAND ${KWQ_WORK_DIR}/build/prometheus_consumer RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "the kwq::prometheus consumer failed (or was not built): ${rc}")
  endif()
endif()
# pkg-config must find kwq in the same prefix.
file(GLOB pcdir ${prefix}/lib*/pkgconfig)
execute_process(COMMAND ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${pcdir}
                        pkg-config --cflags --libs kwq
                RESULT_VARIABLE rc OUTPUT_VARIABLE flags)
if(rc OR NOT flags MATCHES "-lkwq")
  message(FATAL_ERROR "pkg-config kwq failed (${rc}): ${flags}")
endif()
# ... and its paths must point into that prefix (the file once named the configure-time
# prefix, /usr/local): the consumer must build from the pkg-config flags alone.
execute_process(COMMAND ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${pcdir}
                        pkg-config --variable=includedir kwq
                RESULT_VARIABLE rc OUTPUT_VARIABLE includedir OUTPUT_STRIP_TRAILING_WHITESPACE)
file(REAL_PATH "${includedir}" includedir)
file(REAL_PATH "${prefix}/include" expected_includedir)
if(rc OR NOT includedir STREQUAL expected_includedir)
  message(FATAL_ERROR "pkg-config kwq: includedir ${includedir}, expected ${expected_includedir}")
endif()
message(STATUS "pkg-config kwq: ${flags}")
# ... and so must kwq-prometheus's, when this build has kwq::prometheus.
if(KWQ_WITH_PROMETHEUS)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${pcdir}
                          pkg-config --libs kwq-prometheus
                  RESULT_VARIABLE rc OUTPUT_VARIABLE flags)
  if(rc OR NOT flags MATCHES "-lkwq_prometheus" OR NOT flags MATCHES "-lprometheus-cpp-core")
    message(FATAL_ERROR "pkg-config kwq-prometheus failed (${rc}): ${flags}")
  endif()
endif()
