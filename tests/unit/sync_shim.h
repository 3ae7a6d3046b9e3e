/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A VFS shim for the checkpoint tests (test_ckpt.c, test_consumer_ckpt.c) and the relay's
 * (test_relay_lib.c), registered as the default VFS by shim_install(): it counts the syncs of
 * main database files made by the thread that sets t_watch (a checkpoint syncs the database
 * file; a commit in WAL mode syncs only the WAL), makes every sync of the thread that sets
 * t_sync_delay_ms wait that long first (a commit's frames are then in the WAL that long before
 * it is visible), and passes everything else through. Include after cmocka.h, in one file per
 * executable.
 */
#ifndef OQ_TEST_SYNC_SHIM_H
#define OQ_TEST_SYNC_SHIM_H

#include <sqlite3.h>
#include <time.h>

static sqlite3_vfs *real_vfs;
static sqlite3_vfs shim_vfs;
static _Thread_local int t_watch;         /* this thread's main-db syncs are counted */
static _Thread_local int t_syncs;         /* ... here */
static _Thread_local int t_sync_delay_ms; /* this thread's syncs wait this long first */

typedef struct {
    sqlite3_file base;
    int main_db;
    sqlite3_file *real; /* follows this struct */
} shim_file_t;

#define REAL(f) (((shim_file_t *)(f))->real)

static int s_close(sqlite3_file *f)
{
    int rc = REAL(f)->pMethods ? REAL(f)->pMethods->xClose(REAL(f)) : SQLITE_OK;
    return rc;
}
static int s_read(sqlite3_file *f, void *b, int n, sqlite3_int64 o)
{
    return REAL(f)->pMethods->xRead(REAL(f), b, n, o);
}
static int s_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 o)
{
    return REAL(f)->pMethods->xWrite(REAL(f), b, n, o);
}
static int s_truncate(sqlite3_file *f, sqlite3_int64 sz)
{
    return REAL(f)->pMethods->xTruncate(REAL(f), sz);
}
static int s_sync(sqlite3_file *f, int flags)
{
    if (((shim_file_t *)f)->main_db && t_watch) t_syncs++;
    if (t_sync_delay_ms > 0) {
        struct timespec ts = {t_sync_delay_ms / 1000, (long)(t_sync_delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    return REAL(f)->pMethods->xSync(REAL(f), flags);
}
static int s_size(sqlite3_file *f, sqlite3_int64 *sz)
{
    return REAL(f)->pMethods->xFileSize(REAL(f), sz);
}
static int s_lock(sqlite3_file *f, int l)
{
    return REAL(f)->pMethods->xLock(REAL(f), l);
}
static int s_unlock(sqlite3_file *f, int l)
{
    return REAL(f)->pMethods->xUnlock(REAL(f), l);
}
static int s_reserved(sqlite3_file *f, int *r)
{
    return REAL(f)->pMethods->xCheckReservedLock(REAL(f), r);
}
static int s_fctl(sqlite3_file *f, int op, void *a)
{
    return REAL(f)->pMethods->xFileControl(REAL(f), op, a);
}
static int s_sector(sqlite3_file *f)
{
    return REAL(f)->pMethods->xSectorSize(REAL(f));
}
static int s_devchar(sqlite3_file *f)
{
    return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f));
}
static int s_shmmap(sqlite3_file *f, int pg, int sz, int ext, void volatile **pp)
{
    return REAL(f)->pMethods->xShmMap(REAL(f), pg, sz, ext, pp);
}
static int s_shmlock(sqlite3_file *f, int off, int n, int flags)
{
    return REAL(f)->pMethods->xShmLock(REAL(f), off, n, flags);
}
static void s_shmbarrier(sqlite3_file *f)
{
    REAL(f)->pMethods->xShmBarrier(REAL(f));
}
static int s_shmunmap(sqlite3_file *f, int del)
{
    return REAL(f)->pMethods->xShmUnmap(REAL(f), del);
}
static int s_fetch(sqlite3_file *f, sqlite3_int64 o, int n, void **pp)
{
    return REAL(f)->pMethods->xFetch(REAL(f), o, n, pp);
}
static int s_unfetch(sqlite3_file *f, sqlite3_int64 o, void *p)
{
    return REAL(f)->pMethods->xUnfetch(REAL(f), o, p);
}

static const sqlite3_io_methods shim_io = {
    3,         s_close,      s_read,     s_write, s_truncate, s_sync,    s_size,
    s_lock,    s_unlock,     s_reserved, s_fctl,  s_sector,   s_devchar, s_shmmap,
    s_shmlock, s_shmbarrier, s_shmunmap, s_fetch, s_unfetch};

static int s_open(sqlite3_vfs *v, const char *name, sqlite3_file *f, int flags, int *out)
{
    (void)v;
    shim_file_t *sf = (shim_file_t *)f;
    sf->real = (sqlite3_file *)(sf + 1);
    sf->main_db = (flags & SQLITE_OPEN_MAIN_DB) != 0;
    int rc = real_vfs->xOpen(real_vfs, name, sf->real, flags, out);
    sf->base.pMethods = rc == SQLITE_OK ? &shim_io : NULL;
    return rc;
}

static void shim_install(void)
{
    if (real_vfs) return;
    real_vfs = sqlite3_vfs_find(NULL);
    assert_non_null(real_vfs);
    shim_vfs = *real_vfs;
    shim_vfs.zName = "oq-test-shim";
    shim_vfs.szOsFile = (int)sizeof(shim_file_t) + real_vfs->szOsFile;
    shim_vfs.xOpen = s_open;
    assert_int_equal(sqlite3_vfs_register(&shim_vfs, 1), SQLITE_OK);
}

#endif
