# Checks that every test and benchmark the docs cite by name still exists, so a renamed
# or deleted test cannot leave a promise in docs/semantics.md pointing at nothing.
#
#   cmake -DROOT=<source dir> -P scripts/check_doc_names.cmake   (a ctest: docs_names)
#
# In the docs below, a backquoted name counts as a citation when it is `Suite.*` (some
# test of that suite must exist), `Suite.Name` with a Name of 20 characters or more (that
# test must exist), or a bare identifier of 20 characters or more (a test or suite of that
# name, or the identifier anywhere in the code, a benchmark's BM_ function included). Shorter
# names are API words (`Add`, `Queue.Len`) and are not checked.

cmake_minimum_required(VERSION 3.25)
if(NOT ROOT)
  message(FATAL_ERROR "usage: cmake -DROOT=<source dir> -P check_doc_names.cmake")
endif()

set(docs docs/semantics.md docs/reliability.md docs/design.md docs/benchmarks.md
         docs/benchmark-history.md docs/guide.md docs/workqueues.md)

# Every test defined: "Suite.Name" (the first argument of TEST_P is the fixture).
file(GLOB_RECURSE test_sources ${ROOT}/tests/*.cc ${ROOT}/fuzz/*.cc)
set(tests "")
foreach(file IN LISTS test_sources)
  file(READ ${file} text)
  string(REGEX MATCHALL "TEST(_F|_P)?\\([ \n]*[A-Za-z0-9_]+[ \n]*,[ \n]*[A-Za-z0-9_]+[ \n]*\\)"
         defs "${text}")
  foreach(def IN LISTS defs)
    string(REGEX REPLACE "^TEST(_F|_P)?\\([ \n]*([A-Za-z0-9_]+)[ \n]*,[ \n]*([A-Za-z0-9_]+).*$"
                         "\\2.\\3" def "${def}")
    list(APPEND tests ${def})
  endforeach()
endforeach()
set(suites ${tests})
list(TRANSFORM suites REPLACE "\\..*$" "")
set(names ${tests})
list(TRANSFORM names REPLACE "^.*\\." "")

# Everything else a bare identifier may name.
file(GLOB_RECURSE code_files ${ROOT}/include/*.h ${ROOT}/src/*.h ${ROOT}/src/*.cc
     ${ROOT}/bench/*.cc ${ROOT}/bench/*.h ${ROOT}/tools/*.cc ${ROOT}/tools/*.h
     ${ROOT}/examples/*.cc ${ROOT}/tests/*.h)
set(code "")
foreach(file IN LISTS code_files)
  file(READ ${file} text)
  string(APPEND code "${text}")
endforeach()

set(missing "")
set(checked 0)
foreach(doc IN LISTS docs)
  file(READ ${ROOT}/${doc} text)
  string(REGEX MATCHALL "`[A-Za-z0-9_.*]+`" tokens "${text}")
  list(REMOVE_DUPLICATES tokens)
  foreach(token IN LISTS tokens)
    string(REPLACE "`" "" token "${token}")
    if(token MATCHES "^([A-Z][A-Za-z0-9]*)\\.\\*$")
      math(EXPR checked "${checked} + 1")
      list(FIND suites "${CMAKE_MATCH_1}" at)
    elseif(token MATCHES "^([A-Z][A-Za-z0-9]*)\\.([A-Z][A-Za-z0-9]*)$")
      string(LENGTH "${CMAKE_MATCH_2}" length)
      if(length LESS 20)
        continue()
      endif()
      math(EXPR checked "${checked} + 1")
      list(FIND tests "${token}" at)
    elseif(token MATCHES "^[A-Z][A-Za-z0-9]*$")
      string(LENGTH "${token}" length)
      if(length LESS 20)
        continue()
      endif()
      math(EXPR checked "${checked} + 1")
      list(FIND names "${token}" at)
      if(at EQUAL -1)
        list(FIND suites "${token}" at)
      endif()
      if(at EQUAL -1)
        string(FIND "${code}" "${token}" at)
      endif()
    else()
      continue()
    endif()
    if(at EQUAL -1)
      list(APPEND missing "${doc}: `${token}`")
    endif()
  endforeach()
endforeach()

if(missing)
  list(JOIN missing "\n  " lines)
  message(FATAL_ERROR "names the docs cite that no test or code defines:\n  ${lines}")
endif()
message(STATUS "docs cite ${checked} test and code names; every one exists")
