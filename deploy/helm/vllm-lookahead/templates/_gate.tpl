{{/*
The release gate's pod spec, shared by the Helm test hook (gate-job.yaml) and the Argo Rollouts
AnalysisTemplate (gate-analysistemplate.yaml): `vllm-lookahead gate` in endpoint mode between the
baseline arm's Service and the candidate's.  Exit 0 PASS, 1 FAIL, 2 endpoint/usage error: any non-zero
exit fails the Job, hence `helm test` or the analysis run.  Call with
(dict "root" $ "baselineURL" URL "candidateURL" URL).
*/}}
{{- define "vllm-lookahead.gatePodSpec" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $g := $v.gate -}}
restartPolicy: Never
automountServiceAccountToken: false
{{- with $v.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 2000
  runAsGroup: 2000
  seccompProfile:
    type: RuntimeDefault
{{- with $g.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
containers:
  - name: gate
    image: {{ printf "%s:%s" (default $v.image.repository $g.image.repository) (default (default $root.Chart.AppVersion $v.image.tag) $g.image.tag) | quote }}
    imagePullPolicy: {{ $v.image.pullPolicy }}
    command: ["vllm-lookahead", "gate"]
    args:
      - {{ printf "--baseline-url=%s" .baselineURL | quote }}
      - {{ printf "--candidate-url=%s" .candidateURL | quote }}
      - {{ printf "--model=%s" (default $v.model.name $v.model.servedModelName) | quote }}
      - --concurrency={{ $g.concurrency }}
      - --report=/reports/gate
      - --junit=/reports/junit.xml
      {{- if $g.policy }}
      - --policy=/etc/vllm-lookahead-gate/policy.yaml
      {{- end }}
      {{- range $g.args }}
      - {{ . | quote }}
      {{- end }}
    env:
      - name: HOME
        value: /tmp
      - name: MPLCONFIGDIR
        value: /tmp/matplotlib
    resources:
      {{- toYaml $g.resources | nindent 6 }}
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities:
        drop: [ALL]
    volumeMounts:
      - name: reports
        mountPath: /reports
      - name: tmp
        mountPath: /tmp
      {{- if $g.policy }}
      - name: policy
        mountPath: /etc/vllm-lookahead-gate
        readOnly: true
      {{- end }}
volumes:
  - name: reports
    emptyDir: {}
  - name: tmp
    emptyDir: {}
  {{- if $g.policy }}
  - name: policy
    configMap:
      name: {{ include "vllm-lookahead.componentName" (dict "root" $root "component" "gate-policy") }}
  {{- end }}
{{- end -}}

{{/* Service URLs of the two arms inside the cluster. */}}
{{- define "vllm-lookahead.gateURL" -}}
{{- printf "http://%s.%s.svc:%v" (include "vllm-lookahead.componentName" (dict "root" .root "component" .component)) .root.Release.Namespace .root.Values.server.service.port -}}
{{- end -}}
