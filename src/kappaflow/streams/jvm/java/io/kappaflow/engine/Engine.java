package io.kappaflow.engine;

/** What the Python side asks of the engine's jar before it plans a job on it. */
public final class Engine {
  /** The version of the plans' contract between the Python side and these classes. */
  public static final int CONTRACT = 1;

  private Engine() {}

  /** The contract this jar implements; a session refuses a jar with another one. */
  public static int contract() {
    return CONTRACT;
  }
}
