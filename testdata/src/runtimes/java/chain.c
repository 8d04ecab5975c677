/* The native half of fixture.Chain: viaNative calls back into Java. Built
 * without the stack protector so that the library needs nothing from the
 * C library of whichever Debian release runs it. */
#include <jni.h>

static jmethodID back;

JNIEXPORT jlong JNICALL Java_fixture_Chain_viaNative(JNIEnv *env, jclass cls, jlong n)
{
	jlong r;

	/* Looked up once: the time goes to the callback, not to JNI. */
	if (!back)
		back = (*env)->GetStaticMethodID(env, cls, "back", "(J)J");
	if (!back)
		return -1;
	r = (*env)->CallStaticLongMethod(env, cls, back, n);
	/* Work after the call keeps it from being a tail call. */
	return r + 1;
}
