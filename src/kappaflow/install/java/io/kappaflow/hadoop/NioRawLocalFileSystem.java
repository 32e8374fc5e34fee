package io.kappaflow.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.io.nativeio.NativeIO;

/**
 * Hadoop's local file system without a child process per call. Without Hadoop's native
 * library, RawLocalFileSystem runs {@code chmod} for every file and directory it
 * creates and {@code readlink} for every link-status lookup (FileContext's rename).
 * Structured Streaming makes several such calls per micro-batch (offset and commit
 * logs, state store files), each a fork and exec of the JVM. Here both go through
 * java.nio.
 */
public class NioRawLocalFileSystem extends RawLocalFileSystem {
  private static final PosixFilePermission[] BITS = {
    PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE,
    PosixFilePermission.OTHERS_READ, PosixFilePermission.GROUP_EXECUTE,
    PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
    PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE,
    PosixFilePermission.OWNER_READ,
  };

  static Set<PosixFilePermission> posix(FsPermission permission) {
    int mode = permission.toShort();
    Set<PosixFilePermission> out = EnumSet.noneOf(PosixFilePermission.class);
    for (int bit = 0; bit < BITS.length; bit++) {
      if ((mode & (1 << bit)) != 0) {
        out.add(BITS[bit]);
      }
    }
    return out;
  }

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    if (NativeIO.isAvailable()) {
      super.setPermission(p, permission);
      return;
    }
    Files.setPosixFilePermissions(pathToFile(p).toPath(), posix(permission));
  }

  @Override
  public FileStatus getFileLinkStatus(Path f) throws IOException {
    if (NativeIO.isAvailable() || Files.isSymbolicLink(pathToFile(f).toPath())) {
      return super.getFileLinkStatus(f);
    }
    return getFileStatus(f);
  }
}
