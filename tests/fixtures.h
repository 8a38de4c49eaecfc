/* Test helpers: where the fixtures are, and small file utilities. */
#ifndef GP_TESTS_FIXTURES_H
#define GP_TESTS_FIXTURES_H

#include <stddef.h>

/* "<source root>/models/<name>" into buf (GP_SOURCE_ROOT is set by meson). */
const char *fixture_path(const char *name, char *buf, size_t size);
/* The whole file, malloc'd; NULL on failure. */
unsigned char *read_whole(const char *path, size_t *size);
/* Writes bytes to path; 0 on success. */
int write_whole(const char *path, const void *data, size_t size);
/* A fresh temporary folder (mkdtemp) for the test's files. */
const char *temp_dir(char *buf, size_t size);
/* Removes a folder and everything below it (links are not followed). */
void remove_tree(const char *dir);

#endif
