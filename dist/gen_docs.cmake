# SPDX-License-Identifier: Apache-2.0
# Writes, from the built binary ONCEQ into OUT: completion/onceq (`onceq completion bash`),
# doc/onceq.txt (`onceq --help`) and doc/onceq-<command>.txt (`onceq <command> --help`) for
# every command that `onceq --help` lists. Run by the build (target onceq_docs).
file(MAKE_DIRECTORY ${OUT}/completion ${OUT}/doc)
execute_process(COMMAND ${ONCEQ} completion bash OUTPUT_FILE ${OUT}/completion/onceq
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "onceq completion bash failed: ${rc}")
endif()
execute_process(COMMAND ${ONCEQ} --help OUTPUT_VARIABLE top RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "onceq --help failed: ${rc}")
endif()
file(WRITE ${OUT}/doc/onceq.txt "${top}")
string(REGEX MATCHALL "\n  [a-z]+ " words "${top}")
foreach(w ${words})
  string(STRIP "${w}" cmd)
  execute_process(COMMAND ${ONCEQ} ${cmd} --help OUTPUT_FILE ${OUT}/doc/onceq-${cmd}.txt
    RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "onceq ${cmd} --help failed: ${rc}")
  endif()
endforeach()
