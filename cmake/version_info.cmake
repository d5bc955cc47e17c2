# Writes OUT (the build's version facts) from version_info.hpp.in at build time, so the commit is
# the one built, not the one configured. configure_file leaves OUT untouched when nothing changed,
# so an unchanged commit recompiles nothing.
# -D: SRC (source dir), OUT, VERSION, BUILD_TYPE, CUDA (ON/OFF)
set(SHARDLAB_GIT_COMMIT unknown)
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SRC} rev-parse --short=12 HEAD
                  OUTPUT_VARIABLE commit RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(rc EQUAL 0 AND commit)
    set(SHARDLAB_GIT_COMMIT ${commit})
    execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SRC} status --porcelain --untracked-files=no
                    OUTPUT_VARIABLE changes RESULT_VARIABLE rc ERROR_QUIET)
    if(rc EQUAL 0 AND changes)
      string(APPEND SHARDLAB_GIT_COMMIT "-dirty")
    endif()
  endif()
endif()
set(SHARDLAB_VERSION ${VERSION})
set(SHARDLAB_BUILD_TYPE ${BUILD_TYPE})
set(SHARDLAB_CUDA_BUILT ${CUDA})
configure_file(${SRC}/tools/version_info.hpp.in ${OUT} @ONLY)
