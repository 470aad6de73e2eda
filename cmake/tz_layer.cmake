# tz_layer: one library per layer, which exports only its public headers.
#
#   tz_layer(NAME tz_core [INTERFACE] [IF <variable>]
#            SOURCES arena.c ...            # explicit: no file(GLOB) for library sources
#            PUBLIC_HEADERS tier.h ...      # what the layers above may include
#            PRIVATE_HEADERS tier_impl.h ...# what only this target's own sources may include
#            DEPS tz_util ...               # layers below, and libraries its public headers need
#            PRIVATE_DEPS PkgConfig::URING) # libraries only its sources need
#
# Paths are relative to the folder whose CMakeLists.txt calls it. Headers keep the tree's include
# style ("core/tier.h", from the source root): at configure time each public header is linked
# (a symbolic link, so editing the header needs no reconfigure) under
# ${CMAKE_BINARY_DIR}/include/<target>/<path from the source root>, the target's PUBLIC include
# directory, and its public and private headers under include-private/<target>/..., its PRIVATE
# one. No target gets the source root itself, so a header that is not in the public list of a
# target one links is "No such file or directory" where it is included.
#
# IF <variable>: the target exists only where the variable is true (TZ_HAVE_CUDA); its files are
# still counted as known to the check below.
#
# tz_layer_check_folders(core tiers ...), called once after every folder was added: a source or a
# header in one of those folders that no tz_layer call names (a new file someone forgot to list)
# stops the configure with its name, instead of a link error or a missing header later.

function(tz_stage_headers dir)
  file(REMOVE_RECURSE ${dir})
  file(MAKE_DIRECTORY ${dir})
  foreach(h ${ARGN})
    file(RELATIVE_PATH rel ${CMAKE_SOURCE_DIR} ${h})
    get_filename_component(parent ${dir}/${rel} DIRECTORY)
    file(MAKE_DIRECTORY ${parent})
    file(CREATE_LINK ${h} ${dir}/${rel} SYMBOLIC)
  endforeach()
endfunction()

function(tz_layer)
  cmake_parse_arguments(L "INTERFACE" "NAME;IF"
                        "SOURCES;PUBLIC_HEADERS;PRIVATE_HEADERS;DEPS;PRIVATE_DEPS" ${ARGN})
  if(L_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "tz_layer(${L_NAME}): unknown arguments ${L_UNPARSED_ARGUMENTS}")
  endif()
  set(files "")
  foreach(kind SOURCES PUBLIC_HEADERS PRIVATE_HEADERS)
    set(abs "")
    foreach(f ${L_${kind}})
      set(p ${CMAKE_CURRENT_SOURCE_DIR}/${f})
      if(NOT EXISTS ${p})
        file(RELATIVE_PATH rel ${CMAKE_SOURCE_DIR} ${p})
        message(FATAL_ERROR "tz_layer(${L_NAME}): ${rel} is listed in ${kind} but does not exist")
      endif()
      list(APPEND abs ${p})
    endforeach()
    set(${kind} ${abs})
    list(APPEND files ${abs})
  endforeach()
  set_property(GLOBAL APPEND PROPERTY TZ_LAYER_KNOWN_FILES ${files})
  if(L_IF AND NOT ${L_IF})
    return()
  endif()

  set(pub ${CMAKE_BINARY_DIR}/include/${L_NAME})
  tz_stage_headers(${pub} ${PUBLIC_HEADERS})
  if(L_INTERFACE)
    add_library(${L_NAME} INTERFACE)
    target_include_directories(${L_NAME} INTERFACE ${pub})
    target_link_libraries(${L_NAME} INTERFACE ${L_DEPS})
    return()
  endif()
  set(priv ${CMAKE_BINARY_DIR}/include-private/${L_NAME})
  tz_stage_headers(${priv} ${PUBLIC_HEADERS} ${PRIVATE_HEADERS})
  add_library(${L_NAME} STATIC ${SOURCES})
  target_include_directories(${L_NAME} PUBLIC ${pub} PRIVATE ${priv})
  target_link_libraries(${L_NAME} PUBLIC ${L_DEPS} PRIVATE ${L_PRIVATE_DEPS})
  set_property(GLOBAL APPEND PROPERTY TZ_LAYERS ${L_NAME})
endfunction()

function(tz_layer_check_folders)
  get_property(known GLOBAL PROPERTY TZ_LAYER_KNOWN_FILES)
  set(missing "")
  foreach(d ${ARGN})
    set(dir ${CMAKE_SOURCE_DIR}/${d})
    file(GLOB_RECURSE found CONFIGURE_DEPENDS ${dir}/*.c ${dir}/*.cu ${dir}/*.h ${dir}/*.cuh)
    foreach(f ${found})
      list(FIND known ${f} i)
      if(i LESS 0)
        file(RELATIVE_PATH rel ${CMAKE_SOURCE_DIR} ${f})
        list(APPEND missing ${rel})
      endif()
    endforeach()
  endforeach()
  if(missing)
    list(JOIN missing ", " missing)
    message(FATAL_ERROR "files in no layer's lists (add each to a tz_layer call in its folder's "
                        "CMakeLists.txt): ${missing}")
  endif()
endfunction()
