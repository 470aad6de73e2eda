# Runs a command that must fail: it must exit non-zero within LIMIT seconds (not be killed by the
# limit) and its output must match EXPECT. Used for the killed-rank and hung-rank MPI tests.
#   cmake -DCMD="mpirun|-np|3|prog|kill" -DLIMIT=30 -DEXPECT="regex" -P expect_failure.cmake
# (arguments separated by '|', which survives ctest's command line where ';' does not)
string(REPLACE "|" ";" CMD "${CMD}")
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${CMD} TIMEOUT ${LIMIT} RESULT_VARIABLE rv OUTPUT_VARIABLE out
                ERROR_VARIABLE out)
string(TIMESTAMP t1 "%s")
math(EXPR took "${t1} - ${t0}")
message("${out}")
message("exit: ${rv}, ${took} s")
if(rv MATCHES "timeout")
  message(FATAL_ERROR "still running after ${LIMIT} s: the other ranks did not stop")
endif()
if(rv EQUAL 0)
  message(FATAL_ERROR "exited 0; a failure was expected")
endif()
if(NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "the output does not match '${EXPECT}'")
endif()
